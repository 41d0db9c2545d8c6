package controller

import (
	"context"
	"errors"
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

// liveClaims is an API server that holds some BuildLocks (by name, with
// their resourceVersions when versions says) and counts the reads it
// serves; fail, when set, is the answer to every read.
type liveClaims struct {
	claims   map[string]types.UID
	versions map[string]string
	fail     error
	reads    int
}

func (l *liveClaims) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	l.reads++
	if l.fail != nil {
		return l.fail
	}
	uid, ok := l.claims[key.Name]
	if !ok {
		return apierrors.NewNotFound(buildlockv1.GroupVersion.WithResource("buildlocks").GroupResource(), key.Name)
	}
	obj.(*buildlockv1.BuildLock).ObjectMeta = metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, UID: uid,
		ResourceVersion: l.versions[key.Name]}
	return nil
}

func (l *liveClaims) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("holderGone must read one claim by name, never list")
}

func TestHolderGone(t *testing.T) {
	lease := func(holder string) *coordinationv1.Lease {
		return &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder)}}
	}
	claim := func(name string, uid types.UID) buildlockv1.BuildLock {
		return buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Name: name, UID: uid}}
	}
	for name, tc := range map[string]struct {
		lease    *coordinationv1.Lease
		cached   []buildlockv1.BuildLock
		live     map[string]types.UID
		fail     error
		gone     bool
		reads    int
		wantsErr bool
	}{
		"a lock without a Lease has no holder to lose": {
			gone: true,
		},
		"a Lease that names nobody has no holder to lose": {
			lease: &coordinationv1.Lease{}, gone: true,
		},
		"a Lease with an empty holder has no holder to lose": {
			lease: lease(""), gone: true,
		},
		"a holder among the observed claims was accounted for by the decision, without a read": {
			lease: lease("web-7/u7"), cached: []buildlockv1.BuildLock{claim("web-7", "u7")}, fail: errors.New("no read expected"), gone: true,
		},
		"a holder missing from the claims and from the API server is gone": {
			lease: lease("web-7/u7"), live: map[string]types.UID{}, gone: true, reads: 1,
		},
		"a holder missing from stale claims but present on the API server is not gone": {
			lease: lease("web-7/u7"), live: map[string]types.UID{"web-7": "u7"}, gone: false, reads: 1,
		},
		"a holder replaced by another claim of its name is gone": {
			lease: lease("web-7/u7"), live: map[string]types.UID{"web-7": "u8"}, gone: true, reads: 1,
		},
		"a cached claim of the holder's name but another UID does not settle it: the holder itself may be newer than the cache": {
			lease: lease("web-7/u7"), cached: []buildlockv1.BuildLock{claim("web-7", "u6")}, live: map[string]types.UID{"web-7": "u7"}, gone: false, reads: 1,
		},
		"a holder that cannot be read is not taken for gone": {
			lease: lease("web-7/u7"), fail: apierrors.NewServiceUnavailable("etcd is down"), wantsErr: true, reads: 1,
		},
	} {
		t.Run(name, func(t *testing.T) {
			live := &liveClaims{claims: tc.live, fail: tc.fail}
			r := &LockReconciler{APIReader: live}
			gone, err := r.holderGone(context.Background(), arbiter.Lock{Namespace: "ci", Target: "staging"}, observation{claims: tc.cached, lease: tc.lease})
			if (err != nil) != tc.wantsErr {
				t.Fatalf("error: got %v, want an error %t", err, tc.wantsErr)
			}
			if !tc.wantsErr && gone != tc.gone {
				t.Errorf("gone: got %t, want %t", gone, tc.gone)
			}
			if live.reads != tc.reads {
				t.Errorf("live reads: got %d, want %d", live.reads, tc.reads)
			}
		})
	}
}

func TestExpiryStale(t *testing.T) {
	cached := []buildlockv1.BuildLock{{ObjectMeta: metav1.ObjectMeta{Name: "web-7", UID: "u7", ResourceVersion: "10"}}}
	ends := func(reason string) arbiter.Decision {
		return arbiter.Decision{GrantChanged: true, Verdicts: []arbiter.Verdict{
			{Name: "web-7", UID: "u7", From: arbiter.Held, Phase: arbiter.Expired, Reason: reason},
			{Name: "shop-9", UID: "u9", From: arbiter.Waiting, Phase: arbiter.Held, Reason: arbiter.ReasonAcquired},
		}}
	}
	for name, tc := range map[string]struct {
		decision arbiter.Decision
		live     map[string]string // resourceVersions; a name without one is not found
		fail     error
		stale    bool
		reads    int
		wantsErr bool
	}{
		"a decision that ends no hold by expiry reads nothing": {
			decision: arbiter.Decision{Verdicts: []arbiter.Verdict{{Name: "web-7", From: arbiter.Held, Phase: arbiter.Released, Reason: arbiter.ReasonPodFinished}}},
			fail:     errors.New("no read expected"),
		},
		"a hold past its maximum hold ends on the grant's acquire time, without a read": {
			decision: ends(arbiter.ReasonMaxHoldExceeded), fail: errors.New("no read expected"),
		},
		"an expiry on the claim as the API server has it stands": {
			decision: ends(arbiter.ReasonExpired), live: map[string]string{"web-7": "10"}, reads: 1,
		},
		"an expiry on a claim the API server has newer (a renewal the cache missed) is stale": {
			decision: ends(arbiter.ReasonExpired), live: map[string]string{"web-7": "11"}, stale: true, reads: 1,
		},
		"an expiry on a claim that is gone is stale": {
			decision: ends(arbiter.ReasonExpired), live: map[string]string{}, stale: true, reads: 1,
		},
		"an expiry whose claim cannot be read is not applied": {
			decision: ends(arbiter.ReasonExpired), fail: apierrors.NewServiceUnavailable("etcd is down"), wantsErr: true, reads: 1,
		},
	} {
		t.Run(name, func(t *testing.T) {
			live := &liveClaims{claims: map[string]types.UID{}, versions: tc.live, fail: tc.fail}
			for n := range tc.live {
				live.claims[n] = "u7"
			}
			r := &LockReconciler{APIReader: live}
			stale, err := r.expiryStale(context.Background(), arbiter.Lock{Namespace: "ci", Target: "staging"}, observation{claims: cached}, tc.decision)
			if (err != nil) != tc.wantsErr {
				t.Fatalf("error: got %v, want an error %t", err, tc.wantsErr)
			}
			if !tc.wantsErr && stale != tc.stale {
				t.Errorf("stale: got %t, want %t", stale, tc.stale)
			}
			if live.reads != tc.reads {
				t.Errorf("live reads: got %d, want %d", live.reads, tc.reads)
			}
		})
	}
}
