package lock

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// WatchStatus calls show with the locks that Status returns, once the
// claims are listed and again each time a claim change changes them (a new
// holder, a place in a queue, a phase), until ctx ends, which returns nil,
// or show fails, which returns its error. The claims come from one watch
// (relisted when it falls behind), so a change costs the API server one
// read of the lock's policy, not a list of the claims; a policy change alone
// shows with the next claim change. Errors are those of Status.
//
// c needs list and watch on buildlocks, and get and list on
// buildlockpolicies.
func WatchStatus(ctx context.Context, c client.WithWatch, namespace, target string, show func([]Summary) error, opts ...Option) error {
	o := newOptions(opts)
	selector := fields.Everything()
	if target != "" {
		selector = byTarget(target)
	}
	var shown []Summary
	first := true
	err := watchClaims(ctx, c, namespace, selector, o.onError, func(store cache.Store) (bool, error) {
		var claims []buildlockv1.BuildLock
		for _, bl := range claimsIn(store) {
			claims = append(claims, *bl)
		}
		locks, err := summarizeWithPolicies(ctx, c, namespace, target, claims, o)
		if err != nil {
			return false, err
		}
		if !first && equality.Semantic.DeepEqual(locks, shown) {
			return false, nil
		}
		first, shown = false, locks
		return false, show(locks)
	})
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return err
}

// summarizeWithPolicies is Summarize with the policies read as Status reads
// them (ones that cannot be read leave the ordering empty),
// and the grant Leases' audits added (addAudits).
func summarizeWithPolicies(ctx context.Context, c client.Reader, namespace, target string, claims []buildlockv1.BuildLock, o options) ([]Summary, error) {
	policies, err := readPolicies(ctx, c, namespace, target)
	if err == nil {
		if policies == nil {
			policies = []buildlockv1.BuildLockPolicy{} // read: none
		}
		return addAudits(ctx, c, namespace, target, Summarize(claims, policies), policies, o.onError), nil
	}
	if !apierrors.IsForbidden(err) && !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err) {
		return nil, err
	}
	o.onError(fmt.Errorf("%w; the ordering is shown as unknown", err))
	locks := Summarize(claims, nil)
	for i := range locks {
		locks[i].Ordering = ""
	}
	return addAudits(ctx, c, namespace, target, locks, nil, o.onError), nil
}
