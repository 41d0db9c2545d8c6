package chaos

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/watch"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// inWorkflow moves claim name, just created, to workflow wf (spec.workflow):
// the workload writes it so.
func (h *history) inWorkflow(name, wf string) {
	bl := h.claims[name]
	bl.ResourceVersion = h.nextRV()
	bl.Spec.Workflow = wf
	h.ledger.WroteSpec(ns, name, bl.Spec)
	h.c.ObserveClaim(watch.Modified, bl.DeepCopy())
}

// unverified: the operator verifies no requester.
func unverified(time.Time) (bool, bool) { return false, true }

// refused: claim name is Superseded with reason, by no claim.
func (h *history) refused(name, reason string) {
	h.status(name, buildlockv1.PhaseSuperseded, reason, 0, "")
}

// TestCheckerRollbackRules: the checker allows exactly what the rules allow
// of rollbacks and of second workflows (issue 22). Every case that reports
// fails if its rule is taken out of the checker.
func TestCheckerRollbackRules(t *testing.T) {
	pipeline := "system:serviceaccount:chaos-0:" + rollbackAccount
	cases := map[string]struct {
		history func(h *history)
		rules   []string
	}{
		"a rollback refused under rollbacks: Nobody": {
			history: func(h *history) {
				h.setReruns("", buildlockv1.RollbacksNobody)
				heldAndEnded(h, "b10", "acme/shop", 10, 1)
				h.createRollback("b9", "acme/shop", 9, alice)
				h.refused("b9", buildlockv1.ReasonRollbackNotAllowed)
			},
		},
		"a pipeline's rollback refused under rollbacks: PeopleOnly": {
			history: func(h *history) {
				h.setReruns("", buildlockv1.RollbacksPeopleOnly)
				heldAndEnded(h, "b10", "acme/shop", 10, 1)
				h.createRollback("b9", "acme/shop", 9, pipeline)
				h.refused("b9", buildlockv1.ReasonRollbackNotAllowed)
			},
		},
		"a pipeline's rollback granted under rollbacks: Anyone": {
			history: func(h *history) {
				heldAndEnded(h, "b10", "acme/shop", 10, 1)
				h.createRollback("b9", "acme/shop", 9, pipeline)
				h.hold("b9", 2)
			},
		},
		"a second workflow's lower build granted after the first workflow's held": {
			history: func(h *history) {
				heldAndEnded(h, "b10", "acme/shop", 10, 1)
				h.create("n3", "acme/shop", 3, "pod-n3")
				h.inWorkflow("n3", secondWorkflow)
				h.hold("n3", 2)
			},
		},
		"a rollback in a second workflow, refused under Nobody while the first workflow holds": {
			history: func(h *history) {
				h.setReruns("", buildlockv1.RollbacksNobody)
				h.create("n5", "acme/shop", 5, "pod-n5")
				h.inWorkflow("n5", secondWorkflow)
				h.hold("n5", 1)
				h.later(time.Minute)
				h.ledger.PodFinishing(ns, "pod-n5", true)
				h.grant("", 1)
				h.status("n5", buildlockv1.PhaseReleased, buildlockv1.ReasonPodFinished, 0, "")
				h.create("b10", "acme/shop", 10, "pod-b10")
				h.hold("b10", 2)
				h.createRollback("n4", "acme/shop", 4, alice)
				h.inWorkflow("n4", secondWorkflow)
				h.refused("n4", buildlockv1.ReasonRollbackNotAllowed)
			},
		},
		"a rollback refused under rollbacks: Anyone": {
			history: func(h *history) {
				heldAndEnded(h, "b10", "acme/shop", 10, 1)
				h.createRollback("b9", "acme/shop", 9, pipeline)
				h.refused("b9", buildlockv1.ReasonRollbackNotAllowed)
			},
			rules: []string{"rollback-refused"},
		},
		"a person's rollback refused under rollbacks: PeopleOnly": {
			history: func(h *history) {
				h.setReruns("", buildlockv1.RollbacksPeopleOnly)
				heldAndEnded(h, "b10", "acme/shop", 10, 1)
				h.createRollback("b9", "acme/shop", 9, alice)
				h.refused("b9", buildlockv1.ReasonRollbackNotAllowed)
			},
			rules: []string{"rollback-refused"},
		},
		"a claim that is no rollback refused as one": {
			history: func(h *history) {
				h.setReruns("", buildlockv1.RollbacksNobody)
				heldAndEnded(h, "b10", "acme/shop", 10, 1)
				h.create("b9", "acme/shop", 9, "pod-b9")
				h.refused("b9", buildlockv1.ReasonRollbackNotAllowed)
			},
			rules: []string{"rollback-refused"},
		},
		"a rollback not allowed, superseded by the line's memory instead of refused": {
			history: func(h *history) {
				h.setReruns("", buildlockv1.RollbacksNobody)
				heldAndEnded(h, "b10", "acme/shop", 10, 1)
				h.createRollback("b9", "acme/shop", 9, alice)
				h.refused("b9", buildlockv1.ReasonSupersededByNewerBuild)
			},
			rules: []string{"rollback-refused"},
		},
		"a pipeline's rollback granted under rollbacks: PeopleOnly": {
			history: func(h *history) {
				h.setReruns("", buildlockv1.RollbacksPeopleOnly)
				heldAndEnded(h, "b10", "acme/shop", 10, 1)
				h.createRollback("b9", "acme/shop", 9, pipeline)
				h.hold("b9", 2)
			},
			rules: []string{"no-rollback"},
		},
		"a second workflow deploys backwards within its own line": {
			history: func(h *history) {
				h.create("n10", "acme/shop", 10, "pod-n10")
				h.inWorkflow("n10", secondWorkflow)
				h.hold("n10", 1)
				h.later(time.Minute)
				h.ledger.PodFinishing(ns, "pod-n10", true)
				h.grant("", 1)
				h.status("n10", buildlockv1.PhaseReleased, buildlockv1.ReasonPodFinished, 0, "")
				h.create("b20", "acme/shop", 20, "pod-b20")
				h.create("n9", "acme/shop", 9, "pod-n9")
				h.inWorkflow("n9", secondWorkflow)
				h.hold("n9", 2)
			},
			rules: []string{"no-rollback"},
		},
		"a person's rollback refused under PeopleOnly, the requester not yet verified": {
			history: func(h *history) {
				h.c.o.RequesterVerified = unverified
				h.setReruns("", buildlockv1.RollbacksPeopleOnly)
				heldAndEnded(h, "b10", "acme/shop", 10, 1)
				h.createRollback("b9", "acme/shop", 9, alice)
				h.refused("b9", buildlockv1.ReasonRollbackNotAllowed)
			},
		},
		"a person's rollback granted under PeopleOnly, maybe verified": {
			history: func(h *history) {
				h.c.o.RequesterVerified = func(time.Time) (bool, bool) { return false, false }
				h.setReruns("", buildlockv1.RollbacksPeopleOnly)
				heldAndEnded(h, "b10", "acme/shop", 10, 1)
				h.createRollback("b9", "acme/shop", 9, alice)
				h.hold("b9", 2)
			},
		},
		"a person's rollback granted under PeopleOnly, the requester not verified": {
			history: func(h *history) {
				h.c.o.RequesterVerified = unverified
				h.setReruns("", buildlockv1.RollbacksPeopleOnly)
				heldAndEnded(h, "b10", "acme/shop", 10, 1)
				h.createRollback("b9", "acme/shop", 9, alice)
				h.hold("b9", 2)
			},
			rules: []string{"no-rollback"},
		},
		"a line's memory lowered to its granted rollback": {
			history: func(h *history) {
				heldAndEnded(h, "b10", "acme/shop", 10, 1)
				h.remember("acme/shop", 10, h.now)
				h.createRollback("b8", "acme/shop", 8, alice)
				h.hold("b8", 2)
				h.remember("acme/shop", 8, h.now)
			},
		},
		"a line's memory lowered to a rollback whose claim the checker has not seen yet": {
			history: func(h *history) {
				heldAndEnded(h, "b10", "acme/shop", 10, 1)
				h.remember("acme/shop", 10, h.now)
				h.ledger.WroteSpec(ns, "b8", buildlockv1.BuildLockSpec{Target: "env-0", Repo: "acme/shop", Branch: "main", Build: 8,
					Rollback: &buildlockv1.Rollback{Reason: "INC-7: checkout broke"}})
				h.grant("b8", 2)
				h.remember("acme/shop", 8, h.now)
			},
		},
		"a line's memory lowered with no rollback": {
			history: func(h *history) {
				heldAndEnded(h, "b10", "acme/shop", 10, 1)
				h.remember("acme/shop", 10, h.now)
				h.later(time.Second)
				h.remember("acme/shop", 8, h.now)
			},
			rules: []string{"line-memory-kept"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHistory(t)
			tc.history(h)
			h.expect(tc.rules...)
		})
	}
}
