package lock

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// Summary is one lock (a namespace and a target) at a glance: how it
// orders its builds, who holds it, and who waits in which order.
type Summary struct {
	Namespace string `json:"namespace"`
	Target    string `json:"target"`
	// Ordering is the lock's BuildLockPolicy's spec.ordering (NewestWins
	// without a policy); empty when the policies could not be read.
	Ordering buildlockv1.Ordering `json:"ordering,omitempty"`
	// Frozen, while the policy's deploy windows freeze the target, says
	// until when and why (FreezeOf); empty when it is open.
	Frozen string `json:"frozen,omitempty"`
	// Holder is the claim that holds the lock, if any.
	Holder *ClaimSummary `json:"holder,omitempty"`
	// Queue is the claims that wait for the lock, in the order they are
	// granted: the first (Position 1) is next.
	Queue []ClaimSummary `json:"queue,omitempty"`
	// Claims are all the lock's claims, the finished ones included, newest
	// first.
	Claims []ClaimSummary `json:"claims"`
	// Audit is the lock's grant record's audit of notable events, oldest
	// first (buildlockv1.AuditAnnotation): force-releases, rollbacks and
	// overrides, with who and why. It outlives the claims: a lock that has
	// none left but an audit is summarized too. Empty when the grant Lease
	// could not be read.
	Audit []buildlockv1.AuditEntry `json:"audit,omitempty"`
}

// ClaimSummary is one claim in a Summary.
type ClaimSummary struct {
	Name     string `json:"name"`
	Repo     string `json:"repo"`
	Branch   string `json:"branch"`
	Workflow string `json:"workflow,omitempty"`
	Build    int64  `json:"build"`
	Pod      string `json:"pod,omitempty"`
	RunID    string `json:"runID,omitempty"`
	// Rollback is the claim's spec.rollback, when it is a rollback.
	Rollback *buildlockv1.Rollback `json:"rollback,omitempty"`
	// Phase is Pending for a claim the operator has not decided on yet.
	Phase        buildlockv1.Phase `json:"phase"`
	Reason       string            `json:"reason,omitempty"`
	Message      string            `json:"message,omitempty"`
	FencingToken int64             `json:"fencingToken,omitempty"`
	// Position is the claim's place in the queue, 1 for the next to be
	// granted; 0 for claims that do not wait.
	Position     int                    `json:"position,omitempty"`
	Created      metav1.Time            `json:"created"`
	AcquiredAt   *metav1.MicroTime      `json:"acquiredAt,omitempty"`
	ExpiresAt    *metav1.MicroTime      `json:"expiresAt,omitempty"`
	QueuedAt     *metav1.MicroTime      `json:"queuedAt,omitempty"`
	SupersededBy string                 `json:"supersededBy,omitempty"`
	Timestamp    *buildlockv1.Timestamp `json:"timestamp,omitempty"`
	ExpiresAfter *metav1.Duration       `json:"expiresAfter,omitempty"`
	RenewTime    *buildlockv1.Timestamp `json:"renewTime,omitempty"`
}

// Status reads the locks of namespace ("" for every namespace), or only
// target's when target is set, with their policies. The claims are listed
// by the API server's field selector on spec.target. Policies that cannot be
// read (no right to, or no BuildLockPolicy CRD) leave Ordering empty and
// are reported to the WithErrorHandler option; other errors fail.
//
// c needs list on buildlocks, get and list on buildlockpolicies, and get and
// list on leases (the grant Leases' audits; without them the audits are left
// out and reported to the WithErrorHandler option).
func Status(ctx context.Context, c client.Reader, namespace, target string, opts ...Option) ([]Summary, error) {
	o := newOptions(opts)
	claims, err := listClaims(ctx, c, namespace, target)
	if err != nil {
		return nil, err
	}
	return summarizeWithPolicies(ctx, c, namespace, target, claims, o)
}

// listClaims lists the claims on target in namespace ("" for all
// namespaces), all targets when target is "".
func listClaims(ctx context.Context, c client.Reader, namespace, target string) ([]buildlockv1.BuildLock, error) {
	var list buildlockv1.BuildLockList
	opts := []client.ListOption{client.InNamespace(namespace)}
	if target != "" {
		opts = append(opts, client.MatchingFieldsSelector{Selector: byTarget(target)})
	}
	if err := c.List(ctx, &list, opts...); err != nil {
		return nil, fmt.Errorf("listing BuildLocks%s %s: %w", forTarget(target), inNamespace(namespace), err)
	}
	return list.Items, nil
}

// readPolicies reads the policy of target (a policy is named after its
// target), or every policy when target is "".
func readPolicies(ctx context.Context, c client.Reader, namespace, target string) ([]buildlockv1.BuildLockPolicy, error) {
	if target != "" && namespace != "" {
		var p buildlockv1.BuildLockPolicy
		err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: target}, &p)
		switch {
		case err == nil:
			return []buildlockv1.BuildLockPolicy{p}, nil
		case apierrors.IsNotFound(err):
			return nil, nil // no policy: NewestWins
		}
		return nil, fmt.Errorf("reading the BuildLockPolicy %s/%s: %w", namespace, target, err)
	}
	var list buildlockv1.BuildLockPolicyList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("listing BuildLockPolicies %s: %w", inNamespace(namespace), err)
	}
	return list.Items, nil
}

// Summarize groups claims by lock (sorted by namespace and target) and says
// for each its ordering (from the BuildLockPolicy named after its target,
// NewestWins without one), its holder and its queue. It is a pure function
// of its arguments.
func Summarize(claims []buildlockv1.BuildLock, policies []buildlockv1.BuildLockPolicy) []Summary {
	orderings := map[types.NamespacedName]buildlockv1.Ordering{}
	frozen := map[types.NamespacedName]string{}
	byLock := map[types.NamespacedName][]*buildlockv1.BuildLock{}
	for _, p := range policies {
		key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
		orderings[key] = cmp.Or(p.Spec.Ordering, buildlockv1.OrderingNewestWins)
		if frozen[key] = FreezeOf(&p); frozen[key] != "" {
			byLock[key] = nil // a frozen target is shown without claims too
		}
	}
	for i := range claims {
		bl := &claims[i]
		key := types.NamespacedName{Namespace: bl.Namespace, Name: bl.Spec.Target}
		byLock[key] = append(byLock[key], bl)
	}
	locks := make([]Summary, 0, len(byLock))
	for key, claims := range byLock {
		ls := Summary{
			Namespace: key.Namespace, Target: key.Name,
			Ordering: cmp.Or(orderings[key], buildlockv1.OrderingNewestWins),
			Frozen:   frozen[key], Claims: []ClaimSummary{},
		}
		if h := holderOf(claims); h != nil {
			cs := claimSummaryOf(h)
			ls.Holder = &cs
		}
		for i, bl := range queueOf(claims) {
			cs := claimSummaryOf(bl)
			cs.Position = i + 1
			ls.Queue = append(ls.Queue, cs)
		}
		slices.SortFunc(claims, func(a, b *buildlockv1.BuildLock) int {
			return cmp.Or(b.CreationTimestamp.Compare(a.CreationTimestamp.Time), cmp.Compare(a.Name, b.Name))
		})
		for _, bl := range claims {
			ls.Claims = append(ls.Claims, claimSummaryOf(bl))
		}
		locks = append(locks, ls)
	}
	slices.SortFunc(locks, func(a, b Summary) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Target, b.Target))
	})
	return locks
}

func claimSummaryOf(bl *buildlockv1.BuildLock) ClaimSummary {
	c := ClaimSummary{
		Name: bl.Name, Repo: bl.Spec.Repo, Branch: bl.Spec.Branch, Workflow: bl.Spec.Workflow, Build: bl.Spec.Build, RunID: RunIDOf(bl),
		Rollback: bl.Spec.Rollback,
		Phase:    phaseOf(bl), Reason: bl.Status.Reason, Message: bl.Status.Message,
		FencingToken: bl.Status.FencingToken, Created: bl.CreationTimestamp,
		AcquiredAt: bl.Status.AcquiredAt, ExpiresAt: bl.Status.ExpiresAt, QueuedAt: bl.Status.QueuedAt,
		SupersededBy: bl.Status.SupersededBy,
		Timestamp:    bl.Spec.Timestamp, ExpiresAfter: bl.Spec.ExpiresAfter, RenewTime: bl.Spec.RenewTime,
	}
	if bl.Spec.PodRef != nil {
		c.Pod = bl.Spec.PodRef.Name
	}
	return c
}

// phaseOf is the claim's phase, Pending before the operator decided.
func phaseOf(bl *buildlockv1.BuildLock) buildlockv1.Phase {
	return cmp.Or(bl.Status.Phase, buildlockv1.PhasePending)
}

// holderOf returns the claim that holds the lock, of one lock's claims: of
// those shown Held, the one with the highest fencing token. Two claims are
// shown Held only for a moment of a hand-off (the old holder's end and the
// new holder's grant are two status writes), and the higher token is the
// newer grant. Ties go to the name, so that the answer is stable. nil when
// no claim is shown Held.
func holderOf(claims []*buildlockv1.BuildLock) *buildlockv1.BuildLock {
	var holder *buildlockv1.BuildLock
	for _, bl := range claims {
		if bl.Status.Phase != buildlockv1.PhaseHeld {
			continue
		}
		if holder == nil || bl.Status.FencingToken > holder.Status.FencingToken ||
			bl.Status.FencingToken == holder.Status.FencingToken && bl.Name < holder.Name {
			holder = bl
		}
	}
	return holder
}

// queueOf returns the claims of one lock that wait (Waiting, or Pending: not
// decided yet), in the order the lock grants them (compareQueued).
func queueOf(claims []*buildlockv1.BuildLock) []*buildlockv1.BuildLock {
	var queue []*buildlockv1.BuildLock
	for _, bl := range claims {
		if p := phaseOf(bl); p == buildlockv1.PhaseWaiting || p == buildlockv1.PhasePending {
			queue = append(queue, bl)
		}
	}
	slices.SortFunc(queue, compareQueued)
	return queue
}

// compareQueued orders waiting claims as their lock grants them:
//  1. claims with status.queuedAt (their place in a Queue or Fifo lock)
//     before claims without one;
//  2. an earlier queuedAt first;
//  3. Waiting before Pending (among claims without queuedAt, NewestWins's
//     waiting claim before claims the operator has not decided on yet);
//  4. the name, unique among one lock's claims: a total order.
func compareQueued(a, b *buildlockv1.BuildLock) int {
	qa, qb := a.Status.QueuedAt, b.Status.QueuedAt
	if c := cmp.Compare(boolRank(qa == nil), boolRank(qb == nil)); c != 0 {
		return c
	}
	if qa != nil {
		if c := qa.Compare(qb.Time); c != 0 {
			return c
		}
	}
	waitingA, waitingB := phaseOf(a) == buildlockv1.PhaseWaiting, phaseOf(b) == buildlockv1.PhaseWaiting
	return cmp.Or(cmp.Compare(boolRank(!waitingA), boolRank(!waitingB)), cmp.Compare(a.Name, b.Name))
}

// boolRank sorts false before true.
func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Place is a waiting claim's place in its lock.
type Place struct {
	// Position is 1 for the claim granted next; Waiting is how many claims
	// wait in all.
	Position, Waiting int
	// Ahead names the claim directly ahead, "" at position 1.
	Ahead string
	// Holder names the claim that holds the lock ("" when none does), and
	// Token its fencing token.
	Holder string
	Token  int64
}

// String says where the claim stands: "2 of 3 (behind acme-api-main-3-staging);
// acme-shop-main-41-staging holds it with fencing token 5".
func (p Place) String() string {
	s := fmt.Sprintf("%d of %d (behind %s)", p.Position, p.Waiting, p.Ahead)
	if p.Position == 1 {
		s = fmt.Sprintf("1 of %d (next)", p.Waiting)
	}
	if p.Holder != "" {
		s += fmt.Sprintf("; %s holds it with fencing token %d", p.Holder, p.Token)
	}
	return s
}

// placeOf returns bl's place among its lock's claims, nil when it does not
// wait.
func placeOf(claims []*buildlockv1.BuildLock, bl *buildlockv1.BuildLock) *Place {
	queue := queueOf(claims)
	i := slices.IndexFunc(queue, func(q *buildlockv1.BuildLock) bool { return q.UID == bl.UID })
	if i < 0 {
		return nil
	}
	p := &Place{Position: i + 1, Waiting: len(queue)}
	if i > 0 {
		p.Ahead = queue[i-1].Name
	}
	if h := holderOf(claims); h != nil {
		p.Holder, p.Token = h.Name, h.Status.FencingToken
	}
	return p
}

// addAudits gives each lock of locks the audit of its grant Lease, and adds
// a summary for a lock that has an audit but no claims left. Leases that
// cannot be read (a role from before pipelines could read them) leave the
// audits out, and are reported to onError.
func addAudits(ctx context.Context, c client.Reader, namespace, target string, locks []Summary, policies []buildlockv1.BuildLockPolicy, onError func(error)) []Summary {
	leases, err := readGrantLeases(ctx, c, namespace, target)
	if err != nil {
		onError(fmt.Errorf("%w; the audits of endings are not shown", err))
		return locks
	}
	byLock := map[types.NamespacedName]int{}
	for i, l := range locks {
		byLock[types.NamespacedName{Namespace: l.Namespace, Name: l.Target}] = i
	}
	added := false
	for _, lease := range leases {
		var audit []buildlockv1.AuditEntry
		s := lease.Annotations[buildlockv1.AuditAnnotation]
		if s == "" || json.Unmarshal([]byte(s), &audit) != nil || len(audit) == 0 {
			continue
		}
		key := types.NamespacedName{Namespace: lease.Namespace, Name: lease.Labels[targetLabel]}
		if i, ok := byLock[key]; ok {
			locks[i].Audit = audit
			continue
		}
		if key.Name == "" {
			continue
		}
		locks = append(locks, Summary{Namespace: key.Namespace, Target: key.Name, Ordering: orderingOf(policies, key), Audit: audit})
		added = true
	}
	if added {
		slices.SortFunc(locks, func(a, b Summary) int {
			return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Target, b.Target))
		})
	}
	return locks
}

// targetLabel on a grant Lease names its target.
const targetLabel = "buildlock.io/target"

// readGrantLeases reads the grant Lease of target, or all of namespace's
// ("" for every namespace) when target is "".
func readGrantLeases(ctx context.Context, c client.Reader, namespace, target string) ([]coordinationv1.Lease, error) {
	if target != "" && namespace != "" {
		var lease coordinationv1.Lease
		err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: buildlockv1.GrantLeaseName(target)}, &lease)
		switch {
		case apierrors.IsNotFound(err):
			return nil, nil
		case err != nil:
			return nil, fmt.Errorf("reading the grant Lease of %s in %s: %w", target, namespace, err)
		}
		return []coordinationv1.Lease{lease}, nil
	}
	var list coordinationv1.LeaseList
	opts := []client.ListOption{client.InNamespace(namespace), client.MatchingLabels{"app.kubernetes.io/managed-by": "buildlock"}}
	if target != "" {
		opts = append(opts, client.MatchingLabels{targetLabel: target})
	}
	if err := c.List(ctx, &list, opts...); err != nil {
		return nil, fmt.Errorf("listing the grant Leases %s: %w", inNamespace(namespace), err)
	}
	return list.Items, nil
}

// orderingOf is the ordering of lock key under policies (NewestWins
// without one; empty when policies could not be read, nil).
func orderingOf(policies []buildlockv1.BuildLockPolicy, key types.NamespacedName) buildlockv1.Ordering {
	if policies == nil {
		return ""
	}
	for _, p := range policies {
		if p.Namespace == key.Namespace && p.Name == key.Name {
			return cmp.Or(p.Spec.Ordering, buildlockv1.OrderingNewestWins)
		}
	}
	return buildlockv1.OrderingNewestWins
}

func forTarget(target string) string {
	if target == "" {
		return ""
	}
	return fmt.Sprintf(" for target %q", target)
}

func inNamespace(namespace string) string {
	if namespace == "" {
		return "in all namespaces"
	}
	return "in namespace " + namespace
}
