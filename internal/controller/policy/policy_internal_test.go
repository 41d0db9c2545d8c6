package policy

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

func TestFor(t *testing.T) {
	lock := arbiter.Lock{Namespace: "ci", Target: "staging"}
	policy := func(ordering buildlockv1.Ordering, maxHold time.Duration) *buildlockv1.BuildLockPolicy {
		p := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Name: "staging", Generation: 3}}
		p.Spec.Ordering = ordering
		if maxHold > 0 {
			p.Spec.MaxHold = &metav1.Duration{Duration: maxHold}
		}
		return p
	}
	for name, tc := range map[string]struct {
		obj      *buildlockv1.BuildLockPolicy
		want     arbiter.Policy
		ready    metav1.ConditionStatus
		reason   string
		mentions string
	}{
		"no policy: NewestWins with the operator's flags": {
			want: arbiter.Policy{Ordering: arbiter.NewestWins, MaxHold: time.Hour, LineMemory: time.Minute},
		},
		"Queue with the operator's max hold": {
			obj:   policy(buildlockv1.OrderingQueue, 0),
			want:  arbiter.Policy{Ordering: arbiter.Queue, MaxHold: time.Hour, LineMemory: time.Minute, Rollbacks: arbiter.RollbacksAnyone},
			ready: metav1.ConditionTrue, reason: buildlockv1.ReasonApplied, mentions: "the operator's maximum hold of 1h0m0s",
		},
		"Fifo with its own max hold": {
			obj:   policy(buildlockv1.OrderingFifo, 2*time.Hour),
			want:  arbiter.Policy{Ordering: arbiter.Fifo, MaxHold: 2 * time.Hour, LineMemory: time.Minute, Rollbacks: arbiter.RollbacksAnyone},
			ready: metav1.ConditionTrue, reason: buildlockv1.ReasonApplied, mentions: "a maximum hold of 2h0m0s",
		},
		"re-runs refused, rollbacks by people only": {
			obj: func() *buildlockv1.BuildLockPolicy {
				p := policy(buildlockv1.OrderingNewestWins, 0)
				p.Spec.Reruns, p.Spec.Rollbacks = buildlockv1.RerunsRefused, buildlockv1.RollbacksPeopleOnly
				return p
			}(),
			want: arbiter.Policy{Ordering: arbiter.NewestWins, MaxHold: time.Hour, LineMemory: time.Minute, RefuseReruns: true,
				Rollbacks: arbiter.RollbacksPeopleOnly},
			ready: metav1.ConditionTrue, reason: buildlockv1.ReasonApplied, mentions: "re-runs are refused, and rollbacks are allowed for people only",
		},
		"a rollbacks setting this operator does not know allows none, and says so": {
			obj: func() *buildlockv1.BuildLockPolicy {
				p := policy(buildlockv1.OrderingQueue, 0)
				p.Spec.Rollbacks = "Everybody"
				return p
			}(),
			want:  arbiter.Policy{Ordering: arbiter.Queue, MaxHold: time.Hour, LineMemory: time.Minute, Rollbacks: arbiter.RollbacksNobody},
			ready: metav1.ConditionFalse, reason: buildlockv1.ReasonInvalidPolicy, mentions: "allows no rollbacks until the policy is fixed",
		},
		"an ordering this operator does not know falls back to NewestWins, and says so": {
			obj:   policy("Lottery", 2*time.Hour),
			want:  arbiter.Policy{Ordering: arbiter.NewestWins, MaxHold: time.Hour, LineMemory: time.Minute},
			ready: metav1.ConditionFalse, reason: buildlockv1.ReasonInvalidPolicy, mentions: `"Lottery" is not an ordering`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			got := For(tc.obj, lock, arbiter.Policy{Ordering: arbiter.NewestWins, MaxHold: time.Hour, LineMemory: time.Minute})
			if got.Arbiter != tc.want {
				t.Errorf("policy %+v, want %+v", got.Arbiter, tc.want)
			}
			if tc.obj == nil {
				return
			}
			if got.Ready.Status != tc.ready || got.Ready.Reason != tc.reason || got.Ready.ObservedGeneration != 3 ||
				!strings.Contains(got.Ready.Message, tc.mentions) {
				t.Errorf("condition %+v, want %s %s mentioning %q", got.Ready, tc.ready, tc.reason, tc.mentions)
			}
		})
	}
}
