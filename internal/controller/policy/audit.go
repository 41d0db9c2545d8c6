package policy

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
	"github.com/buildlock/buildlock/internal/controller/admission"
)

// The fence judges a request by whom it names: buildlock-enforce sees the
// user a request impersonates, never who sent it (Kubernetes gives
// admission no trace of the impersonator), and does not judge the target's
// own service accounts, whose tokens and workloads outlive a hold. So the
// policy controller audits each enforced lock's fence: for each fenced
// pipeline identity, a SubjectAccessReview per right that would let it
// write into the target around the fence (bypassChecks), every
// fenceAuditInterval and after each change of the policy, never per claim
// or hand-off. What it finds is the policy's status.bypasses and its
// Bypassable condition.
const (
	// fenceAuditInterval is how often a fence is audited when its policy
	// does not change: RBAC changes are not watched. An audit that failed
	// is tried again after auditRetryInterval.
	fenceAuditInterval = 10 * time.Minute
	auditRetryInterval = time.Minute
	// maxAuditedIdentities bounds the identities audited per lock, and
	// maxAuditedTargetAccounts the target's service accounts whose write
	// rights are looked at.
	maxAuditedIdentities     = 64
	maxAuditedTargetAccounts = 64
	// maxReportedBypasses bounds status.bypasses (the CRD's MaxItems).
	maxReportedBypasses = 32
)

// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
// +kubebuilder:rbac:groups="",resources=serviceaccounts,verbs=list

// subject is an identity as a SubjectAccessReview names it.
type subject struct {
	user   string
	groups []string
	extra  map[string]authorizationv1.ExtraValue
}

// serviceAccountSubject is the service account name of namespace as the
// API server authenticates its tokens.
func serviceAccountSubject(namespace, name string) subject {
	return subject{user: serviceaccount.MakeUsername(namespace, name),
		groups: append(serviceaccount.MakeGroupNames(namespace), "system:authenticated")}
}

// access is one SubjectAccessReview's question: may the subject do verb on
// resource (of group, in namespace; "" for cluster-wide)?
type access struct {
	verb, group, resource, subresource, namespace string
}

// bypassChecks are the questions that give a fenced pipeline each right
// in the fence of target, whose claims live in claims: any yes gives it.
// Workloads count only where the target has a service account that may
// write into it, or the pipeline may bind one a role (workloadQualifiers).
// It has no receiver, to facilitate testing.
func bypassChecks(claims, target string) map[buildlockv1.BypassRight][]access {
	impersonate := []access{
		{verb: "impersonate", resource: "serviceaccounts", namespace: target},
		{verb: "impersonate", resource: "users"},
	}
	if claims != target {
		impersonate = append(impersonate, access{verb: "impersonate", resource: "serviceaccounts", namespace: claims})
	}
	var workloads []access
	for _, r := range [][2]string{{"", "pods"}, {"apps", "deployments"}, {"apps", "replicasets"}, {"apps", "statefulsets"},
		{"apps", "daemonsets"}, {"batch", "jobs"}, {"batch", "cronjobs"}, {"", "replicationcontrollers"}} {
		workloads = append(workloads, access{verb: "create", group: r[0], resource: r[1], namespace: target})
	}
	return map[buildlockv1.BypassRight][]access{
		buildlockv1.BypassImpersonate:          impersonate,
		buildlockv1.BypassServiceAccountTokens: {{verb: "create", resource: "serviceaccounts", subresource: "token", namespace: target}},
		buildlockv1.BypassWorkloads:            workloads,
	}
}

// targetWrites are the writes into target that make a service account of
// the target a writer a workload can run as: a deploy's own kinds.
func targetWrites(target string) []access {
	return []access{
		{verb: "patch", group: "apps", resource: "deployments", namespace: target},
		{verb: "create", resource: "pods", namespace: target},
		{verb: "create", resource: "configmaps", namespace: target},
		{verb: "create", resource: "secrets", namespace: target},
	}
}

// bindRoles is the right that lets a pipeline make any service account of
// target a writer.
func bindRoles(target string) access {
	return access{verb: "create", group: "rbac.authorization.k8s.io", resource: "rolebindings", namespace: target}
}

// rightsOrder lists the rights gravest first: the order of a bypass's
// rights and of the condition's reason.
var rightsOrder = []buildlockv1.BypassRight{buildlockv1.BypassImpersonate, buildlockv1.BypassServiceAccountTokens, buildlockv1.BypassWorkloads}

// rightReasons are the Bypassable condition's reasons for each right.
var rightReasons = map[buildlockv1.BypassRight]string{
	buildlockv1.BypassImpersonate:          buildlockv1.ReasonImpersonation,
	buildlockv1.BypassServiceAccountTokens: buildlockv1.ReasonServiceAccountTokens,
	buildlockv1.BypassWorkloads:            buildlockv1.ReasonWorkloads,
}

// auditState is what the controller remembers of a lock's last audit.
type auditState struct {
	// generation and at are the policy's generation and the time of the
	// last audit, successful or not.
	generation int64
	at         time.Time
	// bypasses are the last successful audit's findings, and identities
	// how many identities it audited.
	bypasses   []buildlockv1.FenceBypass
	identities int
	// err is the last audit's failure; nil when it succeeded.
	err error
}

// interval is how long the audit s stands before the next.
func (s *auditState) interval() time.Duration {
	if s.err != nil {
		return auditRetryInterval
	}
	return fenceAuditInterval
}

// auditor audits enforced locks' fences with SubjectAccessReviews.
type auditor struct {
	// client creates SubjectAccessReviews and reads claims from the cache.
	client client.Client
	// apiReader lists service accounts' names, at each audit.
	apiReader client.Reader
	admission *admission.Policies

	mu    sync.Mutex
	locks map[arbiter.Lock]*auditState
}

// audit returns the lock's last audit, auditing again first when it is
// due: never audited, its policy changed since, or fenceAuditInterval
// passed.
func (a *auditor) audit(ctx context.Context, lock arbiter.Lock, policy *buildlockv1.BuildLockPolicy, now time.Time) auditState {
	a.mu.Lock()
	last := a.locks[lock]
	a.mu.Unlock()
	if last != nil && last.generation == policy.Generation && now.Sub(last.at) < last.interval() {
		return *last
	}
	next := &auditState{generation: policy.Generation, at: now}
	bypasses, identities, err := a.run(ctx, lock, policy)
	switch {
	case err != nil && last != nil:
		next.bypasses, next.identities, next.err = last.bypasses, last.identities, err
	case err != nil:
		next.err = err
	default:
		next.bypasses, next.identities = bypasses, identities
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.locks[lock] = next
	return *next
}

// forget drops what the auditor knows of a lock that enforces nothing.
func (a *auditor) forget(lock arbiter.Lock) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.locks, lock)
}

// run audits the fence of lock under policy: the bypasses found, in
// identity order, and how many identities were audited.
func (a *auditor) run(ctx context.Context, lock arbiter.Lock, policy *buildlockv1.BuildLockPolicy) ([]buildlockv1.FenceBypass, int, error) {
	identities, err := a.fenced(ctx, lock, policy)
	if err != nil {
		return nil, 0, err
	}
	writers, err := a.targetHasWriter(ctx, lock.Target)
	if err != nil {
		return nil, 0, err
	}
	checks := bypassChecks(lock.Namespace, lock.Target)
	var bypasses []buildlockv1.FenceBypass
	for _, id := range identities {
		var rights []buildlockv1.BypassRight
		for _, right := range rightsOrder {
			if right == buildlockv1.BypassWorkloads && !writers {
				binds, err := a.allowed(ctx, id, bindRoles(lock.Target))
				if err != nil {
					return nil, 0, err
				}
				if !binds {
					continue
				}
			}
			yes, err := a.anyAllowed(ctx, id, checks[right])
			if err != nil {
				return nil, 0, err
			}
			if yes {
				rights = append(rights, right)
			}
		}
		if len(rights) > 0 {
			bypasses = append(bypasses, buildlockv1.FenceBypass{Identity: id.user, Rights: rights})
		}
	}
	return bypasses, len(identities), nil
}

// fenced returns the lock's fenced pipeline identities, in user name order:
// the service accounts of the claims namespace that spec.enforce names (or
// all of them), and the CI identities of repositories it fences that claimed
// the lock with a verified requester (the only way to learn the user name
// a CI system's tokens map to), up to maxAuditedIdentities.
func (a *auditor) fenced(ctx context.Context, lock arbiter.Lock, policy *buildlockv1.BuildLockPolicy) ([]subject, error) {
	byUser := map[string]subject{}
	accounts := policy.Spec.Enforce.ServiceAccounts
	if len(accounts) == 0 {
		names, err := a.serviceAccounts(ctx, lock.Namespace)
		if err != nil {
			return nil, err
		}
		accounts = names
	}
	for _, name := range accounts {
		s := serviceAccountSubject(lock.Namespace, name)
		byUser[s.user] = s
	}
	if verifiedSince := a.admission.RequestersVerifiedSince(0); !verifiedSince.IsZero() {
		var claims buildlockv1.BuildLockList
		if err := a.client.List(ctx, &claims, client.InNamespace(lock.Namespace), client.MatchingFields{buildlockv1.TargetField: lock.Target}); err != nil {
			return nil, fmt.Errorf("listing BuildLocks for target %q in %q: %w", lock.Target, lock.Namespace, err)
		}
		repositories := policy.Spec.Enforce.Repositories
		for _, bl := range claims.Items {
			r := bl.Spec.Requester
			if r == nil || r.Repository == "" || r.Username == "" || bl.CreationTimestamp.Time.Before(verifiedSince) ||
				(len(repositories) > 0 && !slices.Contains(repositories, r.Repository)) {
				continue
			}
			byUser[r.Username] = subject{user: r.Username, groups: []string{"system:authenticated"},
				extra: map[string]authorizationv1.ExtraValue{buildlockv1.RepositoryExtra: {r.Repository}}}
		}
	}
	subjects := make([]subject, 0, len(byUser))
	for _, s := range byUser {
		subjects = append(subjects, s)
	}
	slices.SortFunc(subjects, func(x, y subject) int { return cmp.Compare(x.user, y.user) })
	return subjects[:min(len(subjects), maxAuditedIdentities)], nil
}

// serviceAccounts lists the names of namespace's service accounts, live.
func (a *auditor) serviceAccounts(ctx context.Context, namespace string) ([]string, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ServiceAccountList"))
	if err := a.apiReader.List(ctx, list, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("listing the service accounts of %s: %w", namespace, err)
	}
	names := make([]string, 0, len(list.Items))
	for _, sa := range list.Items {
		names = append(names, sa.Name)
	}
	return names, nil
}

// targetHasWriter reports whether a service account of target (up to
// maxAuditedTargetAccounts) may write into it (targetWrites): a workload
// that runs as it writes after its creator's hold. A target whose service
// accounts the operator may not list counts as having one.
func (a *auditor) targetHasWriter(ctx context.Context, target string) (bool, error) {
	names, err := a.serviceAccounts(ctx, target)
	if apierrors.IsForbidden(err) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	slices.Sort(names)
	for _, name := range names[:min(len(names), maxAuditedTargetAccounts)] {
		yes, err := a.anyAllowed(ctx, serviceAccountSubject(target, name), targetWrites(target))
		if err != nil || yes {
			return yes, err
		}
	}
	return false, nil
}

// anyAllowed reports whether s may do any of accesses.
func (a *auditor) anyAllowed(ctx context.Context, s subject, accesses []access) (bool, error) {
	for _, acc := range accesses {
		yes, err := a.allowed(ctx, s, acc)
		if err != nil || yes {
			return yes, err
		}
	}
	return false, nil
}

// allowed asks the API server, with a SubjectAccessReview, whether s may
// do acc.
func (a *auditor) allowed(ctx context.Context, s subject, acc access) (bool, error) {
	review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: s.user, Groups: s.groups, Extra: s.extra,
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: acc.verb, Group: acc.group, Resource: acc.resource, Subresource: acc.subresource, Namespace: acc.namespace,
		},
	}}
	if err := a.client.Create(ctx, review); err != nil {
		return false, fmt.Errorf("asking whether %s may %s %s: %w", s.user, acc.verb, acc.resource, err)
	}
	return review.Status.Allowed, nil
}

// bypassCondition is the Bypassable condition of a lock whose last audit
// is state. It has no receiver, to facilitate testing.
func bypassCondition(lock arbiter.Lock, generation int64, state auditState) metav1.Condition {
	c := metav1.Condition{Type: buildlockv1.ConditionBypassable, ObservedGeneration: generation}
	if state.err != nil {
		c.Status, c.Reason = metav1.ConditionUnknown, buildlockv1.ReasonAuditFailed
		c.Message = truncate(fmt.Sprintf("The operator could not audit the fence of namespace %s, so nothing says whether its pipelines "+
			"can write into it around the fence: %v", lock.Target, state.err), maxQuotedProbeError)
		return c
	}
	if len(state.bypasses) == 0 {
		c.Status, c.Reason = metav1.ConditionFalse, buildlockv1.ReasonNoBypass
		c.Message = fmt.Sprintf("None of the %d fenced pipeline identities of %s may impersonate, create tokens of %s's service "+
			"accounts, or leave a workload in %s that writes there: they write into %s only while they hold its lock.",
			state.identities, lock.Namespace, lock.Target, lock.Target, lock.Target)
		return c
	}
	found := map[buildlockv1.BypassRight][]string{}
	for _, b := range state.bypasses {
		for _, r := range b.Rights {
			found[r] = append(found[r], b.Identity)
		}
	}
	c.Status = metav1.ConditionTrue
	var says, fixes []string
	for _, right := range rightsOrder {
		ids := found[right]
		if len(ids) == 0 {
			continue
		}
		if c.Reason == "" {
			c.Reason = rightReasons[right]
		}
		who := strings.Join(ids, ", ")
		switch right {
		case buildlockv1.BypassImpersonate:
			says = append(says, fmt.Sprintf("%s may impersonate service accounts or users, and admission judges only whom a "+
				"request impersonates", who))
			fixes = append(fixes, fmt.Sprintf("take impersonate from their roles in %s and %s", lock.Target, lock.Namespace))
		case buildlockv1.BypassServiceAccountTokens:
			says = append(says, fmt.Sprintf("%s may create tokens of %s's service accounts, which the fence does not judge "+
				"and which outlive a hold", who, lock.Target))
			fixes = append(fixes, fmt.Sprintf("take create on serviceaccounts/token from their roles in %s", lock.Target))
		case buildlockv1.BypassWorkloads:
			says = append(says, fmt.Sprintf("%s may leave workloads in %s whose pods run as a service account of %s that may "+
				"write there, or may bind it a role, and keep writing after its hold", who, lock.Target, lock.Target))
			fixes = append(fixes, fmt.Sprintf("let no service account of %s write into it", lock.Target))
		}
	}
	c.Message = truncate(fmt.Sprintf("The fence of %s can be bypassed: %s. Close it: %s (the built-in edit and admin roles grant "+
		"impersonate and serviceaccounts/token: bind a copy without them); status.bypasses lists each identity's rights.",
		lock.Target, strings.Join(says, "; "), strings.Join(fixes, "; ")), maxConditionMessage)
	return c
}

// maxConditionMessage bounds a condition's message, in bytes: the API's
// bound is 32768.
const maxConditionMessage = 8192

// truncate cuts s to at most n bytes, on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// reported is the status.bypasses of bypasses: at most maxReportedBypasses.
func reported(bypasses []buildlockv1.FenceBypass) []buildlockv1.FenceBypass {
	return bypasses[:min(len(bypasses), maxReportedBypasses)]
}
