package lock

import (
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	operator "github.com/buildlock/buildlock/internal/controller/grant"
)

const (
	me    = "web-7/uid-w"
	other = "shop-41/uid-h"
)

// version is one version of a grant Lease: holder ("" for nobody) and
// token, written by the operator (labeled) or by someone else.
type version struct {
	holder   string
	token    int64
	operator bool
	deleted  bool
}

func (v version) lease() *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: buildlockv1.GrantLeaseName("staging")}}
	if v.operator {
		l.Labels = map[string]string{buildlockv1.ManagedByLabel: buildlockv1.ManagedByValue}
	}
	if v.holder != "" {
		l.Spec.HolderIdentity = ptr.To(v.holder)
	}
	l.Spec.LeaseTransitions = ptr.To(int32(v.token))
	return l
}

func op(holder string, token int64) version {
	return version{holder: holder, token: token, operator: true}
}
func foreign(holder string, token int64) version { return version{holder: holder, token: token} }

// TestTheClientTrustsOnlyAGrantItSawTheOperatorMake: grantSeen.grant over
// sequences of Lease versions, as a waiter's watch delivers them: the first
// list (initial), then the versions written after.
func TestTheClientTrustsOnlyAGrantItSawTheOperatorMake(t *testing.T) {
	for name, tc := range map[string]struct {
		initial []version // the first list: at most one Lease
		then    []version
		floor   int64 // the namespace's token floor; -1: could not be read
		// floorRV is the floor Lease's resourceVersion as read alongside
		// the first list, taken at resourceVersion 100 ("": none).
		floorRV string
		others  int64 // the highest token the lock's other claims show
		want    int64 // the token trusted, 0 for none
	}{
		"a kept, free Lease names the claim with the next token": {
			initial: []version{op("", 6)}, then: []version{op(me, 7)}, want: 7,
		},
		"the holder's Lease names the claim after the holder's grant": {
			initial: []version{op(other, 6)}, then: []version{op("", 6), op(me, 7)}, want: 7,
		},
		"a new Lease names the claim above the namespace's floor": {
			floor: 200, then: []version{op(me, 201)}, want: 201,
		},
		"a new Lease names another claim, then this one": {
			floor: 200, then: []version{op(other, 201), op("", 201), op(me, 202)}, want: 202,
		},
		"break 1: an edit names the waiter with the holder's token": {
			initial: []version{op(other, 7)}, then: []version{op(me, 7)},
		},
		"break 1: the holder's grant and the edit come in one breath": {
			initial: []version{op("", 6)}, then: []version{op(other, 7), op(me, 7)},
		},
		"break 1: the edit undone: the Lease names the holder again": {
			initial: []version{op(other, 7)}, then: []version{op(me, 7), op(other, 7)},
		},
		"an edit names the claim with a token below a claim's status": {
			initial: []version{op("", 3)}, then: []version{op(me, 4)}, others: 9,
		},
		"the operator's grant above every token the claims show": {
			initial: []version{op("", 9)}, then: []version{op(me, 10)}, others: 9, want: 10,
		},
		"break 2: a foreign Lease names the claim": {
			initial: []version{foreign("", 0)}, then: []version{foreign(me, 1)}, floor: 200,
		},
		"break 2: a foreign Lease given the label names the claim below the floor": {
			initial: []version{foreign("", 0)}, then: []version{op(me, 1)}, floor: 200,
		},
		"the operator's Lease after the foreign one was deleted": {
			initial: []version{foreign("", 0)}, then: []version{{deleted: true}, op(me, 201)}, floor: 200, want: 201,
		},
		"a new Lease when the floor could not be read": {
			floor: -1, then: []version{op(me, 201)},
		},
		"a new Lease, the floor last written before the first list": {
			floor: 200, floorRV: "99", then: []version{op(me, 201)}, want: 201,
		},
		"a new Lease, the floor written after the first list (for that Lease, maybe)": {
			floor: 300, floorRV: "101", then: []version{op(me, 201)},
		},
		"a new Lease, no floor when it was read": {
			then: []version{op(me, 1)}, want: 1,
		},
		"a Lease that already named the claim when first seen": {
			initial: []version{op(me, 7)},
		},
		"a Lease without the label names the claim": {
			initial: []version{op("", 6)}, then: []version{foreign(me, 7)},
		},
		"a grant to another claim of the same name": {
			initial: []version{op("", 6)}, then: []version{op("web-7/uid-older", 7)},
		},
		"a lowered token seen on the way counts for nothing": {
			initial: []version{op(other, 7)}, then: []version{op("", 2), op(me, 8)}, want: 8,
		},
	} {
		t.Run(name, func(t *testing.T) {
			g := newGrantSeen()
			for _, v := range tc.initial {
				g.observe(v.lease(), v.deleted, true)
			}
			g.listed("100")
			if tc.floor >= 0 {
				g.setFloor(tc.floor, tc.floorRV)
			}
			for _, v := range tc.then {
				g.observe(v.lease(), v.deleted, false)
			}
			token, ok := g.grant(me, tc.others)
			switch {
			case tc.want == 0 && ok:
				t.Errorf("trusted a grant with token %d", token)
			case tc.want != 0 && (!ok || token != tc.want):
				t.Errorf("grant() = %d, %v; want %d, true", token, ok, tc.want)
			}
		})
	}
}

// TestAHolderSeesItsGrantMoveAway: grantSeen.moved for a holder, over the
// versions its watch delivers: any version that does not name it, or the
// Lease's absence, ends the hold, even when it is undone at once.
func TestAHolderSeesItsGrantMoveAway(t *testing.T) {
	for name, tc := range map[string]struct {
		initial []version
		then    []version
		moved   bool
	}{
		"the Lease names the holder":              {initial: []version{op(me, 7)}, then: []version{op(me, 7)}},
		"the operator rewrites it, naming it yet": {initial: []version{op(me, 7)}, then: []version{foreign(me, 7), op(me, 7)}},
		"it names another claim":                  {initial: []version{op(me, 7)}, then: []version{op(other, 8)}, moved: true},
		"it names nobody":                         {initial: []version{op(me, 7)}, then: []version{op("", 7)}, moved: true},
		"it is deleted":                           {initial: []version{op(me, 7)}, then: []version{{deleted: true}}, moved: true},
		"an edit and its undoing":                 {initial: []version{op(me, 7)}, then: []version{op(other, 7), op(me, 7)}, moved: true},
		"there is none":                           {moved: true},
		"it named another claim from the start":   {initial: []version{op(other, 7)}, moved: true},
	} {
		t.Run(name, func(t *testing.T) {
			g := newGrantSeen()
			g.hold(me)
			for _, v := range tc.initial {
				g.observe(v.lease(), v.deleted, true)
			}
			g.listed("100")
			for _, v := range tc.then {
				g.observe(v.lease(), v.deleted, false)
			}
			if why := g.moved(); (why != "") != tc.moved {
				t.Errorf("moved() = %q, want moved %v", why, tc.moved)
			}
		})
	}
}

// TestTheAPIsLeaseNamesAreTheOperators: the label and the floor's name
// that pkg/lock reads from the API package are the ones the operator
// writes.
func TestTheAPIsLeaseNamesAreTheOperators(t *testing.T) {
	if buildlockv1.ManagedByLabel != operator.ManagedByLabel || buildlockv1.ManagedByValue != operator.ManagedByValue ||
		buildlockv1.TokenFloorLeaseName != operator.TokenFloorLease {
		t.Errorf("api/v1alpha1 says %s=%s and %s; the operator writes %s=%s and %s", buildlockv1.ManagedByLabel, buildlockv1.ManagedByValue,
			buildlockv1.TokenFloorLeaseName, operator.ManagedByLabel, operator.ManagedByValue, operator.TokenFloorLease)
	}
}
