package lock

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// The grant Lease (buildlockv1.GrantLeaseName) says that a claim holds one
// write before the claim's status does. But it is a Lease, and whoever may
// write Leases in the namespace can create one under that name or edit the
// operator's: the label that buildlock's admission policy reserves to the
// operator (buildlock-grant-leases) proves who wrote it only where that
// policy is installed, and not against a cluster's break-glass
// credentials. So the client takes a Lease for a grant only when
// everything it can check says that the operator made it (grantSeen.grant):
//
//   - the Lease carries the operator's label (buildlockv1.OperatorLease);
//   - it names the claim, by name and UID;
//   - the client saw the grant made: when the client first saw the Lease
//     (before it created the claim), it named another claim or nobody, or
//     there was none;
//   - its token is at or above the claim's floor: above every token the
//     client saw the operator's Lease carry for another claim or for
//     nobody (a lock's tokens grow with every grant), above every token the
//     lock's other claims show in their statuses (which only the operator
//     writes), and, for a Lease created while the client watched, above
//     the namespace's token floor (buildlockv1.TokenFloorLeaseName), read
//     before the Lease was first seen: the operator starts every new
//     Lease above it.
//
// Anything else waits for the claim's status. And a hold learned from the
// Lease lasts only while the claim's status confirms it within
// GrantConfirmTimeout, and while the Lease names the claim (Hold.WaitLost).

// GrantConfirmTimeout bounds how long a hold learned from the grant Lease
// may go before the claim's status, which only the operator writes and
// writes right after the Lease, says Held with the same token: after it,
// Hold.WaitLost reports the hold lost (ReasonNotConfirmed). It is long
// enough for a manager's failover between the two writes (leader election
// takes up to about 20 s).
const GrantConfirmTimeout = time.Minute

// Reasons of a LostError that the client finds itself, from the grant
// Lease and the claim's status.
const (
	// ReasonGrantMoved: the grant Lease stopped naming the claim (it names
	// another claim, or nobody, or it was deleted), whoever changed it.
	ReasonGrantMoved = "GrantMoved"
	// ReasonNotConfirmed: the claim held by its grant Lease, and its status
	// did not say Held with that token within GrantConfirmTimeout, or said
	// Held with another token.
	ReasonNotConfirmed = "GrantNotConfirmed"
)

// grantSeen is what one client saw of its lock's grant Lease while it
// watched: each version in order (observe), so that an edit that names
// the claim right after a grant to another one is judged against that
// grant even when the watcher decides only after both.
type grantSeen struct {
	mu sync.Mutex
	// started: the first state of the Lease has been seen (the feed's
	// initial list is over). first is its holder identity, "" for nobody
	// or none; firstOperator says it was the operator's Lease.
	started       bool
	first         string
	firstOperator bool
	// tokens holds, per holder identity ("" for nobody), the highest token
	// of the operator's versions of the Lease that named it.
	tokens map[string]int64
	// floor is the namespace's token floor as it was when the Lease was
	// first listed (at listRV); floorKnown says it is known.
	floor      int64
	floorKnown bool
	listRV     string
	// current is the latest version, nil while there is none.
	current *coordinationv1.Lease
	// away is set once a version that does not name me, or the Lease's
	// absence, was seen after it named me (see moved).
	me   string
	away string
}

func newGrantSeen() *grantSeen {
	return &grantSeen{tokens: map[string]int64{}}
}

// observe records one version of the Lease (deleted: it is gone);
// initial says it comes from the first list.
func (g *grantSeen) observe(lease *coordinationv1.Lease, deleted, initial bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	holder := ""
	if lease != nil && lease.Spec.HolderIdentity != nil {
		holder = *lease.Spec.HolderIdentity
	}
	if !g.started {
		if initial && !deleted {
			g.first, g.firstOperator = holder, buildlockv1.OperatorLease(lease)
		} else {
			g.started = true // the first list was empty
		}
	}
	if !initial {
		g.started = true
	}
	if deleted {
		g.current = nil
		g.moveAway("the grant Lease was deleted")
		return
	}
	g.current = lease
	if buildlockv1.OperatorLease(lease) {
		g.tokens[holder] = max(g.tokens[holder], buildlockv1.GrantToken(lease))
	}
	if holder != g.me {
		g.moveAway(describeHolder(lease))
	}
}

// moveAway latches why the Lease stopped naming me, once it had.
func (g *grantSeen) moveAway(why string) {
	if g.me != "" && g.away == "" {
		g.away = why
	}
}

// listed marks the end of the first list (the feed synced), taken at
// resourceVersion rv: with nothing observed, there was no Lease.
func (g *grantSeen) listed(rv string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.started, g.listRV = true, rv
}

// needsFloor reports whether the first list showed no Lease of the
// operator's: a grant will come from a Lease created since, whose token
// is above the namespace's floor.
func (g *grantSeen) needsFloor() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.started && !g.firstOperator
}

// setFloor records the namespace's token floor as a read returned it:
// floor, the floor Lease's resourceVersion ("" when there was none). A
// floor read alongside the first list is what the floor was then when the
// Lease was last written at or before the list's snapshot (resource
// versions of one resource are ordered); none, or one read before, is a
// lower bound of it, which serves as well (the floor only rises). One
// written after the snapshot may have been raised for a Lease created
// since, and is no bound at all: it is left unknown.
func (g *grantSeen) setFloor(floor int64, rv string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if rv != "" {
		if g.listRV == "" {
			return // not listed in list mode: nothing to compare with
		}
		if cmp, err := resourceversion.CompareResourceVersion(rv, g.listRV); err != nil || cmp > 0 {
			return
		}
	}
	g.floor, g.floorKnown = floor, true
}

// grant returns the token of the operator's grant to the claim me, as far
// as the client can tell it is one (see the rules above); others is the
// highest fencing token the lock's other claims show.
func (g *grantSeen) grant(me string, others int64) (token int64, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	l := g.current
	if !g.started || l == nil || !buildlockv1.OperatorLease(l) || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != me {
		return 0, false
	}
	if g.first == me {
		return 0, false // granted before the client looked: the status says it
	}
	floor := others + 1
	for holder, t := range g.tokens {
		if holder != me {
			floor = max(floor, t+1)
		}
	}
	if !g.firstOperator {
		// The operator's Lease came after the client started watching: it
		// starts above the namespace's floor.
		if !g.floorKnown {
			return 0, false
		}
		floor = max(floor, g.floor+1)
	}
	token = buildlockv1.GrantToken(l)
	return token, token >= floor
}

// hold makes g follow a hold of me (before the Lease is first seen).
func (g *grantSeen) hold(me string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.me = me
}

// moved says why the grant does not name the claim that g follows (hold),
// or stopped naming it at some point (a change and its undoing, seen in
// one breath, count): "" while it names it.
func (g *grantSeen) moved() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.away != "":
		return g.away
	case !g.started:
		return ""
	case g.current == nil || g.current.Spec.HolderIdentity == nil || *g.current.Spec.HolderIdentity != g.me:
		return describeHolder(g.current)
	}
	return ""
}

// describeHolder says whom lease names, for a LostError's message.
func describeHolder(lease *coordinationv1.Lease) string {
	switch {
	case lease == nil:
		return "there is no grant Lease"
	case lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "":
		return fmt.Sprintf("the grant Lease %s names no holder (fencing token %d)", lease.Name, buildlockv1.GrantToken(lease))
	}
	name, uid := buildlockv1.ParseGrantHolder(*lease.Spec.HolderIdentity)
	return fmt.Sprintf("the grant Lease %s names BuildLock %s (uid %s, fencing token %d)", lease.Name, name, uid, buildlockv1.GrantToken(lease))
}

// grantFeed is the lock's grant Lease, recorded into g version by
// version, with the namespace's token floor read before it is first
// listed. It is optional: a client that may not read Leases learns of its
// grant from the claim's status alone.
func grantFeed(c client.Reader, namespace, target string, g *grantSeen, onError func(error)) *feed {
	f := &feed{kind: "Leases", selector: byName(buildlockv1.GrantLeaseName(target)), example: &coordinationv1.Lease{},
		newList:  func() client.ObjectList { return &coordinationv1.LeaseList{} },
		optional: "learning of the grant from the claim's status only"}
	f.listMode = true
	f.listed = g.listed
	f.alongside = func(ctx context.Context, kick func()) {
		if !g.needsFloor() {
			return
		}
		floor, rv, err := readTokenFloor(ctx, c, namespace)
		switch {
		case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
			// The feed is dropped: the Leases cannot be read at all.
		case err != nil && ctx.Err() == nil:
			onError(fmt.Errorf("%w; a grant Lease created from now on is not trusted, the claim's status says when it holds", err))
		case err == nil:
			g.setFloor(floor, rv)
			kick()
		}
	}
	f.observe = func(obj runtime.Object, deleted, initial bool) {
		if lease, ok := obj.(*coordinationv1.Lease); ok {
			g.observe(lease, deleted, initial)
		}
	}
	return f
}

// errFloorNotOperators says the token floor Lease is not the operator's.
var errFloorNotOperators = fmt.Errorf("the token floor Lease %s does not carry the label %s=%s",
	buildlockv1.TokenFloorLeaseName, buildlockv1.ManagedByLabel, buildlockv1.ManagedByValue)

// readTokenFloor reads the namespace's token floor and its Lease's
// resourceVersion: 0 and "" when there is none (no token was ever issued
// there, or it was deleted: 0 is a lower bound of every floor).
func readTokenFloor(ctx context.Context, c client.Reader, namespace string) (floor int64, rv string, err error) {
	var lease coordinationv1.Lease
	err = c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: buildlockv1.TokenFloorLeaseName}, &lease)
	switch {
	case apierrors.IsNotFound(err):
		return 0, "", nil
	case err != nil:
		return 0, "", fmt.Errorf("reading the token floor of namespace %s: %w", namespace, err)
	case !buildlockv1.OperatorLease(&lease):
		return 0, "", fmt.Errorf("reading the token floor of namespace %s: %w", namespace, errFloorNotOperators)
	}
	return buildlockv1.GrantToken(&lease), lease.ResourceVersion, nil
}
