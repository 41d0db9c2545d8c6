package controller

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

// TestLiveReadsFor maps every kind of decision to the live reads the
// stale-read rule asks of it, taken on the cache and on live reads.
func TestLiveReadsFor(t *testing.T) {
	claim := func(name string, uid types.UID, phase buildlockv1.Phase) buildlockv1.BuildLock {
		bl := buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Name: name, UID: uid, ResourceVersion: "rv-" + name}}
		bl.Status.Phase = phase
		return bl
	}
	lease := func(holder string) *coordinationv1.Lease {
		l := &coordinationv1.Lease{}
		if holder != "" {
			l.Spec.HolderIdentity = ptr.To(holder)
		}
		return l
	}
	verdict := func(name string, from, to arbiter.Phase, reason string) arbiter.Verdict {
		return arbiter.Verdict{Name: name, UID: "u-" + name, From: from, Phase: to, Reason: reason}
	}
	// The lock of most cases: shop-41 holds (the Lease names it), web-7 waits.
	held := []buildlockv1.BuildLock{claim("shop-41", "u-shop-41", buildlockv1.PhaseHeld), claim("web-7", "u-web-7", buildlockv1.PhaseWaiting)}
	handOff := func(reason string) arbiter.Decision {
		return arbiter.Decision{GrantChanged: true, Verdicts: []arbiter.Verdict{
			verdict("shop-41", arbiter.Held, arbiter.Released, reason), verdict("web-7", arbiter.Waiting, arbiter.Held, arbiter.ReasonAcquired)}}
	}
	for name, tc := range map[string]struct {
		claims []buildlockv1.BuildLock
		lease  *coordinationv1.Lease
		live   bool
		// deleted: this manager's informer saw the Lease's holder deleted.
		deleted bool
		d       arbiter.Decision
		want    liveReads
	}{
		"a hand-off from a holder this manager saw deleted rests on a fact": {
			claims: []buildlockv1.BuildLock{claim("web-7", "u-web-7", buildlockv1.PhaseWaiting)}, lease: lease("shop-41/u-shop-41"), deleted: true,
			d: arbiter.Decision{GrantChanged: true, Verdicts: []arbiter.Verdict{verdict("web-7", arbiter.Waiting, arbiter.Held, arbiter.ReasonAcquired)}},
		},
		"a hand-off on live reads from a holder this manager saw deleted rests on a fact": {
			claims: []buildlockv1.BuildLock{claim("web-7", "u-web-7", buildlockv1.PhaseWaiting)}, lease: lease("shop-41/u-shop-41"), deleted: true, live: true,
			d: arbiter.Decision{GrantChanged: true, Verdicts: []arbiter.Verdict{verdict("web-7", arbiter.Waiting, arbiter.Held, arbiter.ReasonAcquired)}},
		},
		"a grant of a free lock rests on the Lease's compare-and-swap": {
			claims: []buildlockv1.BuildLock{claim("shop-41", "u-shop-41", "")}, lease: lease(""),
			d: arbiter.Decision{GrantChanged: true, Verdicts: []arbiter.Verdict{verdict("shop-41", arbiter.Pending, arbiter.Held, arbiter.ReasonAcquired)}},
		},
		"a grant of a lock that never had a Lease rests on the Lease's create": {
			claims: []buildlockv1.BuildLock{claim("shop-41", "u-shop-41", "")},
			d:      arbiter.Decision{GrantChanged: true, Verdicts: []arbiter.Verdict{verdict("shop-41", arbiter.Pending, arbiter.Held, arbiter.ReasonAcquired)}},
		},
		"a hand-off after the holder's pod finished rests on a fact": {
			claims: held, lease: lease("shop-41/u-shop-41"), d: handOff(arbiter.ReasonPodFinished),
		},
		"a hand-off after a force-release rests on a fact": {
			claims: held, lease: lease("shop-41/u-shop-41"), d: handOff(arbiter.ReasonForceReleased),
		},
		"a hand-off at the maximum hold rests on the grant's acquire time, on the Lease": {
			claims: held, lease: lease("shop-41/u-shop-41"),
			d: arbiter.Decision{GrantChanged: true, Verdicts: []arbiter.Verdict{
				verdict("shop-41", arbiter.Held, arbiter.Expired, arbiter.ReasonMaxHoldExceeded), verdict("web-7", arbiter.Waiting, arbiter.Held, arbiter.ReasonAcquired)}},
		},
		"freeing the lock of a holder that is gone from the claims reads that holder": {
			claims: nil, lease: lease("shop-41/u-shop-41"),
			d:    arbiter.Decision{GrantChanged: true},
			want: liveReads{holder: &claimRef{name: "shop-41", uid: "u-shop-41"}},
		},
		"a hand-off from a holder the claims do not show reads that holder": {
			claims: []buildlockv1.BuildLock{claim("web-7", "u-web-7", buildlockv1.PhaseWaiting)}, lease: lease("shop-41/u-shop-41"),
			d:    arbiter.Decision{GrantChanged: true, Verdicts: []arbiter.Verdict{verdict("web-7", arbiter.Waiting, arbiter.Held, arbiter.ReasonAcquired)}},
			want: liveReads{holder: &claimRef{name: "shop-41", uid: "u-shop-41"}},
		},
		"a hand-off from a holder whose name the claims show with another UID reads that holder": {
			claims: []buildlockv1.BuildLock{claim("shop-41", "u-other", ""), claim("web-7", "u-web-7", buildlockv1.PhaseWaiting)}, lease: lease("shop-41/u-shop-41"),
			d:    arbiter.Decision{GrantChanged: true, Verdicts: []arbiter.Verdict{verdict("web-7", arbiter.Waiting, arbiter.Held, arbiter.ReasonAcquired)}},
			want: liveReads{holder: &claimRef{name: "shop-41", uid: "u-shop-41"}},
		},
		"a hand-off from a Lease whose holder names nobody reads nothing": {
			claims: held[1:], lease: lease("/"),
			d: arbiter.Decision{GrantChanged: true, Verdicts: []arbiter.Verdict{verdict("web-7", arbiter.Waiting, arbiter.Held, arbiter.ReasonAcquired)}},
		},
		"an expiry reads the expiring holder, as the decision saw it": {
			claims: held, lease: lease("shop-41/u-shop-41"),
			d: arbiter.Decision{GrantChanged: true, Verdicts: []arbiter.Verdict{
				verdict("shop-41", arbiter.Held, arbiter.Expired, arbiter.ReasonExpired), verdict("web-7", arbiter.Waiting, arbiter.Held, arbiter.ReasonAcquired)}},
			want: liveReads{expiring: []claimRef{{name: "shop-41", uid: "u-shop-41", resourceVersion: "rv-shop-41"}}},
		},
		"the start of a hold without a grant change is decided again live": {
			claims: held[1:], lease: lease("web-7/u-web-7"),
			d:    arbiter.Decision{Verdicts: []arbiter.Verdict{verdict("web-7", arbiter.Waiting, arbiter.Held, arbiter.ReasonAcquired)}},
			want: liveReads{again: true},
		},
		"the end of a hold without a grant change is decided again live": {
			claims: held, lease: lease("web-7/u-web-7"),
			d:    arbiter.Decision{Verdicts: []arbiter.Verdict{verdict("shop-41", arbiter.Held, arbiter.Released, arbiter.ReasonLockLost)}},
			want: liveReads{again: true},
		},
		"an expiry written after its grant already moved is decided again live": {
			claims: held, lease: lease("web-7/u-web-7"),
			d:    arbiter.Decision{Verdicts: []arbiter.Verdict{verdict("shop-41", arbiter.Held, arbiter.Expired, arbiter.ReasonExpired)}},
			want: liveReads{again: true},
		},
		"a supersession without a grant change is decided again live": {
			claims: held, lease: lease("shop-41/u-shop-41"),
			d: arbiter.Decision{Verdicts: []arbiter.Verdict{
				verdict("web-7", arbiter.Waiting, arbiter.Superseded, arbiter.ReasonSupersededByNewerBuild), verdict("web-8", arbiter.Pending, arbiter.Waiting, arbiter.ReasonWaitingForHolder)}},
			want: liveReads{again: true},
		},
		"a waiter's release without a grant change is decided again live": {
			claims: held, lease: lease("shop-41/u-shop-41"),
			d:    arbiter.Decision{Verdicts: []arbiter.Verdict{verdict("web-7", arbiter.Waiting, arbiter.Released, arbiter.ReasonPodGone)}},
			want: liveReads{again: true},
		},
		"a supersession that comes with a grant change rests on the Lease's compare-and-swap": {
			claims: held, lease: lease("shop-41/u-shop-41"),
			d: arbiter.Decision{GrantChanged: true, Verdicts: []arbiter.Verdict{
				verdict("shop-41", arbiter.Held, arbiter.Released, arbiter.ReasonPodFinished),
				verdict("web-7", arbiter.Waiting, arbiter.Superseded, arbiter.ReasonSupersededByNewerBuild),
				verdict("web-8", arbiter.Pending, arbiter.Held, arbiter.ReasonAcquired)}},
		},
		"a wait rests on the waiting claim's own status write": {
			claims: held, lease: lease("shop-41/u-shop-41"),
			d: arbiter.Decision{Verdicts: []arbiter.Verdict{verdict("web-7", arbiter.Pending, arbiter.Waiting, arbiter.ReasonWaitingForHolder)}},
		},
		"a decision that changes no status reads nothing": {
			claims: held, lease: lease("shop-41/u-shop-41"),
			d: arbiter.Decision{Verdicts: []arbiter.Verdict{{Name: "shop-41", From: arbiter.Held, Phase: arbiter.Held}}},
		},
		"a record restored from the claims is decided again live": {
			claims: held, lease: lease(""),
			d:    arbiter.Decision{GrantChanged: true, Repair: "Holder"},
			want: liveReads{again: true},
		},
		"on live reads, a record restored from the claims stands": {
			claims: held, lease: lease(""), live: true,
			d: arbiter.Decision{GrantChanged: true, Repair: "Holder"},
		},
		"a record restored with no Lease in the cache while a claim shows Held is decided again live": {
			claims: held,
			d:      arbiter.Decision{GrantChanged: true, Repair: "Recreated"},
			want:   liveReads{again: true},
		},
		"on live reads, a hand-off from a holder the claims listed before the Lease do not show still reads it": {
			claims: held[1:], lease: lease("shop-41/u-shop-41"), live: true,
			d:    arbiter.Decision{GrantChanged: true, Verdicts: []arbiter.Verdict{verdict("web-7", arbiter.Waiting, arbiter.Held, arbiter.ReasonAcquired)}},
			want: liveReads{holder: &claimRef{name: "shop-41", uid: "u-shop-41"}},
		},
		"on live reads, an expiry reads nothing more": {
			claims: held, lease: lease("shop-41/u-shop-41"), live: true,
			d: arbiter.Decision{GrantChanged: true, Verdicts: []arbiter.Verdict{
				verdict("shop-41", arbiter.Held, arbiter.Expired, arbiter.ReasonExpired), verdict("web-7", arbiter.Waiting, arbiter.Held, arbiter.ReasonAcquired)}},
		},
		"on live reads, the end of a hold without a grant change reads nothing more": {
			claims: held, lease: lease("web-7/u-web-7"), live: true,
			d: arbiter.Decision{Verdicts: []arbiter.Verdict{verdict("shop-41", arbiter.Held, arbiter.Released, arbiter.ReasonLockLost)}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			got := liveReadsFor(observation{claims: tc.claims, lease: tc.lease, live: tc.live, holderDeleted: tc.deleted}, tc.d)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("liveReadsFor = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// liveClaims is an API server that holds some BuildLocks (by name, with
// their UIDs and resourceVersions) and counts the reads it serves; fail,
// when set, is the answer to every read.
type liveClaims struct {
	claims map[string]claimRef
	fail   error
	reads  int
}

func (l *liveClaims) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	l.reads++
	if l.fail != nil {
		return l.fail
	}
	c, ok := l.claims[key.Name]
	if !ok {
		return apierrors.NewNotFound(buildlockv1.GroupVersion.WithResource("buildlocks").GroupResource(), key.Name)
	}
	obj.(*buildlockv1.BuildLock).ObjectMeta = metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, UID: c.uid, ResourceVersion: c.resourceVersion}
	return nil
}

func (l *liveClaims) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("confirm must read claims by name, never list")
}

// TestConfirm makes the reads the rule asks for against an API server and
// tells a decision that stands from one to take again on live reads.
func TestConfirm(t *testing.T) {
	holder := &claimRef{name: "web-7", uid: "u7"}
	expiring := []claimRef{{name: "web-7", uid: "u7", resourceVersion: "10"}}
	unavailable := apierrors.NewServiceUnavailable("etcd is down")
	for name, tc := range map[string]struct {
		reads    liveReads
		live     map[string]claimRef
		fail     error
		stale    bool
		n        int
		wantsErr bool
	}{
		"nothing to read":                    {fail: errors.New("no read expected")},
		"decide again without reading first": {reads: liveReads{again: true}, fail: errors.New("no read expected"), stale: true},
		"a holder gone from the API server is gone": {
			reads: liveReads{holder: holder}, live: map[string]claimRef{}, n: 1,
		},
		"a holder missing from stale claims but on the API server is not gone": {
			reads: liveReads{holder: holder}, live: map[string]claimRef{"web-7": {uid: "u7"}}, stale: true, n: 1,
		},
		"a holder replaced by another claim of its name is gone": {
			reads: liveReads{holder: holder}, live: map[string]claimRef{"web-7": {uid: "u8"}}, n: 1,
		},
		"a holder that cannot be read is not taken for gone": {
			reads: liveReads{holder: holder}, fail: unavailable, wantsErr: true, n: 1,
		},
		"an expiry on the claim as the API server has it stands": {
			reads: liveReads{expiring: expiring}, live: map[string]claimRef{"web-7": {uid: "u7", resourceVersion: "10"}}, n: 1,
		},
		"an expiry on a claim the API server has newer (a renewal the cache missed) is stale": {
			reads: liveReads{expiring: expiring}, live: map[string]claimRef{"web-7": {uid: "u7", resourceVersion: "11"}}, stale: true, n: 1,
		},
		"an expiry on a claim that is gone is stale": {
			reads: liveReads{expiring: expiring}, live: map[string]claimRef{}, stale: true, n: 1,
		},
		"an expiry whose claim cannot be read is not applied": {
			reads: liveReads{expiring: expiring}, fail: unavailable, wantsErr: true, n: 1,
		},
	} {
		t.Run(name, func(t *testing.T) {
			live := &liveClaims{claims: tc.live, fail: tc.fail}
			stale, err := confirm(context.Background(), live, arbiter.Lock{Namespace: "ci", Target: "staging"}, tc.reads)
			if (err != nil) != tc.wantsErr {
				t.Fatalf("error: got %v, want an error %t", err, tc.wantsErr)
			}
			if !tc.wantsErr && stale != tc.stale {
				t.Errorf("stale: got %t, want %t", stale, tc.stale)
			}
			if live.reads != tc.n {
				t.Errorf("live reads: got %d, want %d", live.reads, tc.n)
			}
		})
	}
}

// TestDeletionsRememberTheLatest: a deleted claim is remembered until
// deletionMemory later deletions have pushed it out.
func TestDeletionsRememberTheLatest(t *testing.T) {
	d := newDeletions()
	uid := func(i int) types.UID { return types.UID(fmt.Sprintf("u-%d", i)) }
	for i := range deletionMemory + 10 {
		d.add(uid(i))
		d.add(uid(i)) // an event delivered twice changes nothing
	}
	for i := range deletionMemory + 10 {
		if want := i >= 10; d.has(uid(i)) != want {
			t.Fatalf("has(%s) = %v, want %v", uid(i), !want, want)
		}
	}
	if (*deletions)(nil).has(uid(1)) {
		t.Fatal("a manager without a memory of deletions says a claim was deleted")
	}
}
