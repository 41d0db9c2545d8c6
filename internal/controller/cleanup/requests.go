package cleanup

import (
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// raceRetryDelay is how soon a lock is looked at again after a delete or a
// write lost a race (its precondition no longer held).
const raceRetryDelay = 100 * time.Millisecond

// retryOnRace turns a lost race (Conflict, including a delete precondition
// that no longer holds, or AlreadyExists) into a quick second look; other
// errors go back to the workqueue's backoff.
func retryOnRace(err error) (ctrl.Result, error) {
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		return ctrl.Result{RequeueAfter: raceRetryDelay}, nil
	}
	return ctrl.Result{}, err
}

// lockRequest is the request that concerns the lock of target in
// namespace.
func lockRequest(namespace, target string) reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: namespace, Name: target}}
}
