package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/controller/grant"
)

// ownStatuses are the claims as this manager's latest status writes left
// them, until the cache shows those writes. A reconcile that follows its
// own writes closely (a newcomer's, right after a grant) then decides on
// the claims as they are: without them it would see the new holder still
// Waiting, take its Held for the start of a hold that the Lease does not
// guard, and decide again on live reads; or write a status again on a
// resourceVersion that is gone. A written claim is only ever a later
// version of one the cache lists: a claim the cache does not list (gone)
// is never brought back.
type ownStatuses struct {
	mu      sync.Mutex
	written map[types.UID]ownStatus
	swept   time.Time
}

// ownStatus is a claim as this manager's status write returned it, and
// when.
type ownStatus struct {
	claim *buildlockv1.BuildLock
	at    time.Time
}

func newOwnStatuses() *ownStatuses { return &ownStatuses{written: map[types.UID]ownStatus{}} }

// wrote records this manager's status write at now of claim bl, as the API
// server returned it.
func (o *ownStatuses) wrote(bl *buildlockv1.BuildLock, now time.Time) {
	if o == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.written[bl.UID] = ownStatus{claim: bl.DeepCopy(), at: now}
	if now.Sub(o.swept) > grant.OwnWriteKept {
		// Claims that went before the cache showed their last write.
		for uid, w := range o.written {
			if now.Sub(w.at) > grant.OwnWriteKept {
				delete(o.written, uid)
			}
		}
		o.swept = now
	}
}

// fresher replaces, in claims listed from the cache, each claim this
// manager wrote since the cache's version by that write (see ownStatuses),
// and forgets the writes the cache shows.
func (o *ownStatuses) fresher(claims []buildlockv1.BuildLock, now time.Time) {
	if o == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := range claims {
		w, ok := o.written[claims[i].UID]
		if !ok {
			continue
		}
		if !grant.OwnWriteStands(w.claim.ResourceVersion, claims[i].ResourceVersion, w.at, now) {
			delete(o.written, claims[i].UID)
			continue
		}
		w.claim.DeepCopyInto(&claims[i])
	}
}
