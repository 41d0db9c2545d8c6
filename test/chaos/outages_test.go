package chaos

import (
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// election: the leader-election Lease as holder writes it (holder "": it
// released it), acquired at acquired, renewed now.
func (h *history) election(holder string, acquired time.Time) {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: ElectionLease, ResourceVersion: h.nextRV()},
		Spec: coordinationv1.LeaseSpec{LeaseDurationSeconds: ptr.To(int32(4)), RenewTime: &metav1.MicroTime{Time: h.now}}}
	if holder != "" {
		l.Spec.HolderIdentity = ptr.To(holder)
		l.Spec.AcquireTime = &metav1.MicroTime{Time: acquired}
	}
	h.c.ObserveElection(watch.Modified, l)
}

// TestCheckerAllowsOutages: the time in which no manager could act, as the
// run reports it (managers killed and started, API servers and etcd killed,
// partitions) and the election Lease shows it (no leader), is allowed on
// top of the hold slack to a hold's end, a repair and a deleted claim's
// end; a reaction later than that is still a violation. Each source of an
// outage is a case of its own, so that removing any one fails it.
func TestCheckerAllowsOutages(t *testing.T) {
	outages := map[string]func(h *history){
		"no manager running": func(h *history) {
			h.c.ManagerDown("m1")
			h.later(8 * time.Second)
			h.c.ManagerUp("m2", "kube-apiserver-b", false)
		},
		"its API server killed": func(h *history) {
			h.c.APIServerDown("kube-apiserver-a")
			h.later(8 * time.Second)
			h.c.APIServerUp("kube-apiserver-a")
		},
		"etcd killed": func(h *history) {
			h.c.EtcdDown()
			h.later(8 * time.Second)
			h.c.EtcdUp()
		},
		"cut off (a blackhole partition, or frozen)": func(h *history) {
			h.c.ManagerCut("m1", true)
			h.later(8 * time.Second)
			h.c.ManagerCut("m1", false)
		},
		"the checker's own watch of the claims down": func(h *history) {
			h.c.WatchDown("BuildLock")
			h.later(8 * time.Second)
			h.c.WatchUp("BuildLock")
		},
		"no leader by the election Lease": func(h *history) {
			// m1 is killed; leaders elected in turn stand in. The first
			// loses its Lease (a partition): 8 s from its last renewal to
			// the second's acquireTime.
			h.c.ManagerDown("m1")
			h.c.ManagerUp("le-1", "kube-apiserver-a", true)
			h.c.ManagerUp("le-2", "kube-apiserver-b", true)
			acquired := h.now
			h.election("le-1", acquired)
			h.later(8 * time.Second)
			h.election("le-2", h.now)
			h.later(time.Second)
			h.election("le-2", h.now.Add(-time.Second)) // renewed
			h.c.ManagerDown("le-1")
			h.c.ManagerDown("le-2") // released on the way out
			h.election("", time.Time{})
			h.c.ManagerUp("m2", "kube-apiserver-b", false)
		},
	}
	for name, outage := range outages {
		t.Run(name+": within the allowance", func(t *testing.T) {
			h := newHistory(t)
			holdThrough(h, outage, 17*time.Second)
			h.expect()
			if st := h.c.Stats(); st.LongestAllowance != 8*time.Second || st.LongestExcused != 7*time.Second {
				t.Errorf("allowance %s, excused %s; want 8s and 7s", st.LongestAllowance, st.LongestExcused)
			}
			if f := h.c.OutageFigures(); !strings.Contains(f, "8s in total") && !strings.Contains(f, "8s in all") {
				t.Errorf("figures %q do not say the 8 s", f)
			}
		})
		t.Run(name+": past it", func(t *testing.T) {
			h := newHistory(t)
			holdThrough(h, outage, 19*time.Second)
			h.expect("hold-bounded")
			if v := h.c.Violations(); len(v) == 1 && !strings.Contains(v[0].Msg, "plus 8s in which no manager could act") {
				t.Errorf("the violation does not state the allowance: %s", v[0].Msg)
			}
		})
	}
}

// holdThrough: manager m1 (on kube-apiserver-a) acts; a pod-less hold
// (expiresAfter 10 s) ends; the checker sees it go on 12 s after its
// grant (past the tolerance), then outage happens (8 s of it in which no
// manager could act), and the checker looks again when the hold has gone
// on for over since it first saw it. The slack is 10 s.
func holdThrough(h *history, outage func(*history), over time.Duration) {
	h.c.ManagerUp("m1", "kube-apiserver-a", false)
	h.create("a", "acme/shop", 41, "")
	h.hold("a", 1)
	h.later(12 * time.Second)
	seen := h.now
	h.c.CheckHoldDeadlines(h.now)
	outage(h)
	h.now = seen.Add(over)
	h.c.CheckHoldDeadlines(h.now)
}

// TestCheckerAllowsOutagesToRepairs: a person's deletion of a grant Lease
// is repaired within the slack plus the time no manager ran.
func TestCheckerAllowsOutagesToRepairs(t *testing.T) {
	for _, tc := range []struct {
		over  time.Duration
		rules []string
	}{{17 * time.Second, nil}, {19 * time.Second, []string{"grant-record-repaired"}}} {
		h := newHistory(t)
		h.c.ManagerUp("m1", "kube-apiserver-a", false)
		h.create("a", "acme/shop", 41, "pod-a")
		h.hold("a", 3)
		h.personDeletesLease()
		seen := h.now
		h.c.CheckHoldDeadlines(h.now)
		h.c.ManagerDown("m1")
		h.later(8 * time.Second)
		h.c.ManagerUp("m2", "kube-apiserver-b", false)
		h.now = seen.Add(tc.over)
		h.c.CheckHoldDeadlines(h.now)
		h.expect(tc.rules...)
	}
}

// TestCheckerOutageBoundaries: what is not an outage. A leader that renews
// late led throughout; a manager on the other API server acts while one is
// down; a run that reports no managers gets no allowance; time before the
// hold was seen going on does not count.
func TestCheckerOutageBoundaries(t *testing.T) {
	cases := map[string]func(h *history){
		"the other API server killed": func(h *history) {
			h.c.APIServerDown("kube-apiserver-b")
			h.later(8 * time.Second)
			h.c.APIServerUp("kube-apiserver-b")
		},
		"a watch of the checker's down for less than a second": func(h *history) {
			h.c.WatchDown("BuildLock")
			h.later(900 * time.Millisecond)
			h.c.WatchUp("BuildLock")
		},
		"a second manager while the first is cut off": func(h *history) {
			h.c.ManagerUp("m2", "kube-apiserver-b", false)
			h.c.ManagerCut("m1", true)
			h.later(8 * time.Second)
			h.c.ManagerCut("m1", false)
		},
	}
	for name, outage := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHistory(t)
			holdThrough(h, outage, 11*time.Second)
			h.expect("hold-bounded")
		})
	}
	t.Run("a leader renewing late", func(t *testing.T) {
		h := newHistory(t)
		holdThrough(h, func(h *history) {
			h.c.ManagerDown("m1")
			h.c.ManagerUp("le-1", "kube-apiserver-a", true)
			h.election("le-1", h.now.Add(-time.Second))
		}, 11*time.Second)
		h.expect()                                     // the time since its last renewal counts while it lasts
		h.election("le-1", h.now.Add(-12*time.Second)) // the same term, renewed late
		h.c.CheckHoldDeadlines(h.now)
		h.expect("hold-bounded")
	})
	t.Run("no managers reported", func(t *testing.T) {
		h := newHistory(t)
		h.create("a", "acme/shop", 41, "")
		h.hold("a", 1)
		h.later(12 * time.Second)
		h.c.CheckHoldDeadlines(h.now)
		h.c.EtcdDown()
		h.later(11 * time.Second)
		h.c.CheckHoldDeadlines(h.now)
		h.expect("hold-bounded")
	})
	t.Run("an outage before the hold went on", func(t *testing.T) {
		h := newHistory(t)
		h.c.ManagerUp("m1", "kube-apiserver-a", false)
		h.create("a", "acme/shop", 41, "")
		h.hold("a", 1)
		h.c.ManagerCut("m1", true)
		h.later(8 * time.Second)
		h.c.ManagerCut("m1", false)
		h.later(4 * time.Second)
		h.c.CheckHoldDeadlines(h.now)
		h.later(11 * time.Second)
		h.c.CheckHoldDeadlines(h.now)
		h.expect("hold-bounded")
	})
}

// TestControlPlaneSteady: the actors' judge of a refusal asks whether an
// API server or etcd was down within the last while.
func TestControlPlaneSteady(t *testing.T) {
	h := newHistory(t)
	if !h.c.ControlPlaneSteady(15 * time.Second) {
		t.Error("steady before anything went down: got false")
	}
	h.c.APIServerDown("kube-apiserver-a")
	h.later(5 * time.Second)
	if h.c.ControlPlaneSteady(15 * time.Second) {
		t.Error("steady while an API server is down: got true")
	}
	h.c.APIServerUp("kube-apiserver-a")
	h.later(14 * time.Second)
	if h.c.ControlPlaneSteady(15 * time.Second) {
		t.Error("steady 14 s after an API server came back: got true")
	}
	h.later(2 * time.Second)
	if !h.c.ControlPlaneSteady(15 * time.Second) {
		t.Error("steady 16 s after an API server came back: got false")
	}
	h.c.EtcdDown()
	if h.c.ControlPlaneSteady(15 * time.Second) {
		t.Error("steady while etcd is down: got true")
	}
}

// TestCheckerLeaseGoneWhileBlind: a re-list finds a grant Lease gone whose
// last version the checker saw named a holder. Versions it missed may have
// freed it: that is a violation only if the holder had not ended before
// the list (seen in a short run on a loaded machine: a pod-less holder
// expired, its Lease was freed and deleted, and the claim was deleted by
// the TTL, all while the checker's watches were down).
func TestCheckerLeaseGoneWhileBlind(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ended bool
		rules []string
	}{{"its holder ended unseen", true, nil}, {"its holder still holds", false, []string{"grant-record-kept"}}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHistory(t)
			h.create("a", "acme/shop", 41, "pod-a")
			h.hold("a", 1)
			h.later(2 * time.Hour) // past the grant retention
			if tc.ended {
				h.ledger.PodFinishing(ns, "pod-a", true)
				h.ledger.RequestDelete(ns, "a")
			}
			listRV := h.nextRV()
			h.c.RelistLeases([]coordinationv1.Lease{*h.floor.DeepCopy()}, listRV)
			if tc.ended {
				h.c.RelistClaims(nil, h.nextRV())
			} else {
				h.status("a", buildlockv1.PhaseHeld, buildlockv1.ReasonAcquired, 1, "") // still held, after the list
			}
			h.c.CheckLeaseDeletions()
			h.expect(tc.rules...)
		})
	}
}
