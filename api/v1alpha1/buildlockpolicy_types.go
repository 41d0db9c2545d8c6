package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Ordering is how a lock chooses among the builds that want it. It never
// changes the other rules: one holder, no pre-emption, and a build never
// deploys backwards (a build at or below one of its line that already held
// the lock is Superseded).
// +kubebuilder:validation:Enum=NewestWins;Queue;Fifo
type Ordering string

const (
	// OrderingNewestWins is the default: one waiting slot for the whole lock.
	// Within a line (repo and branch) only the newest build stays in the
	// running; across lines the newest build takes the slot and the others
	// give up. Right for a GitOps environment repository, where each build
	// carries the whole desired state.
	OrderingNewestWins Ordering = "NewestWins"
	// OrderingQueue gives each line one place in a first-come queue: within
	// a line only the newest build stays (it inherits the line's place);
	// across lines nobody supersedes anybody, and lines take the lock in the
	// order they joined. A line whose build held the lock joins at the back
	// with its next build. Right for several apps deploying into one shared
	// namespace: each app's newest build deploys, apps take turns fairly.
	OrderingQueue Ordering = "Queue"
	// OrderingFifo grants every build in arrival order, several builds of
	// one line included (for lines whose every build must deploy, e.g.
	// migrations). Only builds that would deploy backwards (at or below a
	// build of their line that held or is queued ahead) are Superseded.
	OrderingFifo Ordering = "Fifo"
)

// Reruns says whether a new run of the build that held last for its line
// (a CI system's re-run or retry: the same build number, another run) may
// deploy again.
// +kubebuilder:validation:Enum=Allowed;Refused
type Reruns string

const (
	// RerunsAllowed is the default: a run of the build that held last for its
	// line is granted like any build once the earlier run's claim has
	// ended, unless a higher build of the line held since. Two runs of one
	// build never wait or hold at once. GitLab allows retrying a deploy job
	// the same way, and GitHub's "Re-run failed jobs" and Jenkins' "Replay"
	// keep the build number: a failed deploy can be retried.
	RerunsAllowed Reruns = "Allowed"
	// RerunsRefused makes a build deploy once: a re-run of a build that held is
	// Superseded (DuplicateBuild), as GitLab's "Prevent outdated deployment
	// jobs" without retries of rollback deployments does.
	RerunsRefused Reruns = "Refused"
)

// Rollbacks says who may roll back: deploy, on purpose (a claim's
// spec.rollback), a build at or below one of its line that already held.
// +kubebuilder:validation:Enum=Anyone;PeopleOnly;Nobody
type Rollbacks string

const (
	// RollbacksAnyone is the default: pipelines and people may roll back.
	RollbacksAnyone Rollbacks = "Anyone"
	// RollbacksPeopleOnly allows only claims whose requester (spec.requester,
	// stamped by the API server with the identity policies) is verified
	// and is not a service account may roll back. Without those policies no
	// requester is verified, and every rollback is refused: it fails closed.
	RollbacksPeopleOnly Rollbacks = "PeopleOnly"
	// RollbacksNobody refuses every rollback.
	RollbacksNobody Rollbacks = "Nobody"
)

// ConditionReady on a BuildLockPolicy is True when the operator applies the
// policy to its lock, and False with a reason when it cannot (the lock then
// follows NewestWins).
const ConditionReady = "Ready"

// ConditionEnforced on a BuildLockPolicy with spec.enforce is True once the
// API server was seen to fence the target namespace with the lock's
// current grant (the operator's probe write was refused), False with the
// reason when it does not, and Unknown when the probe could not tell.
const ConditionEnforced = "Enforced"

// ConditionIdentityVerified on a BuildLockPolicy is True while the API
// server has the identity admission policies of every installation
// (config/identity: the requester stamp, claim identity, force-release and
// override stamps, freeze and consent authority, the guard on the
// operator's Leases), and False with the missing ones named while it lacks
// any: then every feature of the policy that needs a verified identity
// fails closed (no freeze overrides, no rollbacks under PeopleOnly).
const ConditionIdentityVerified = "IdentityVerified"

// Reasons on a BuildLockPolicy's IdentityVerified condition.
const (
	// ReasonIdentityPoliciesInstalled means the API server has every
	// identity admission policy, each with its binding.
	ReasonIdentityPoliciesInstalled = "IdentityPoliciesInstalled"
	// ReasonIdentityPoliciesMissing means it lacks some (the message names
	// them), or serves no MutatingAdmissionPolicies at all.
	ReasonIdentityPoliciesMissing = "IdentityPoliciesMissing"
)

// ConditionBypassable on a BuildLockPolicy with spec.enforce is True when
// the operator's audit of the fence (a SubjectAccessReview per fenced
// pipeline identity and right, every 10 minutes and after each change of
// the policy) found pipelines whose RBAC lets them write into the target
// around the fence (status.bypasses names them, and the message says how
// to close it), False when it found none, and Unknown when it could not
// tell.
const ConditionBypassable = "Bypassable"

// Reasons on a BuildLockPolicy's Bypassable condition: when it is True, the
// gravest right found, in this order.
const (
	// ReasonImpersonation means a fenced pipeline may impersonate a service
	// account (of the target or claims namespace) or a user: admission
	// sees only whom it impersonates, never who sent the request, so it
	// writes as an identity the fence does not judge.
	ReasonImpersonation = "Impersonation"
	// ReasonServiceAccountTokens means a fenced pipeline may create tokens
	// of the target's service accounts (serviceaccounts/token), which the
	// fence does not judge and which outlive its hold.
	ReasonServiceAccountTokens = "ServiceAccountTokens"
	// ReasonWorkloads means a fenced pipeline may create pods, or workloads
	// that create them, in the target, and a service account of the target
	// may write there (or the pipeline may bind it a role that does): a
	// workload left behind keeps writing after the hold.
	ReasonWorkloads = "Workloads"
	// ReasonNoBypass means the audit found no such right.
	ReasonNoBypass = "NoBypass"
	// ReasonAuditFailed means the audit could not be made (the message
	// says why); the condition is Unknown and status.bypasses keeps the
	// last audit's findings.
	ReasonAuditFailed = "AuditFailed"
)

// BypassRight is a right of a fenced pipeline identity that lets it write
// into an enforced target around the fence.
// +kubebuilder:validation:Enum=Impersonate;CreateServiceAccountTokens;CreateWorkloads
type BypassRight string

// Rights that bypass a fence.
const (
	// BypassImpersonate: it may impersonate service accounts of the target
	// or the claims namespace, or users (RBAC verb impersonate; the
	// built-in edit and admin roles grant it on service accounts).
	BypassImpersonate BypassRight = "Impersonate"
	// BypassServiceAccountTokens: it may create tokens of the target's
	// service accounts (create serviceaccounts/token; edit and admin grant
	// it).
	BypassServiceAccountTokens BypassRight = "CreateServiceAccountTokens"
	// BypassWorkloads: it may create pods or workloads (Deployments,
	// ReplicaSets, StatefulSets, DaemonSets, Jobs, CronJobs) in the target,
	// whose pods run as the target's service accounts, and one of those may
	// write into the target, or the pipeline may bind it a role (create
	// rolebindings).
	BypassWorkloads BypassRight = "CreateWorkloads"
)

// FenceBypass names a fenced pipeline identity whose rights let it write
// into the target around the fence.
type FenceBypass struct {
	// Identity is the pipeline's user name as the API server authenticates
	// it: system:serviceaccount:<claims namespace>:<name>, or a CI
	// identity's.
	// +kubebuilder:validation:MaxLength=512
	Identity string `json:"identity"`
	// Rights are the rights that bypass the fence, gravest first.
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=3
	Rights []BypassRight `json:"rights"`
}

// LockedByLabel on a namespace names the claims namespace whose lock may
// fence it: the target's consent to enforcement.
const LockedByLabel = "buildlock.io/locked-by"

// Reasons on a BuildLockPolicy's Ready condition.
const (
	// ReasonApplied means the policy governs its lock.
	ReasonApplied = "Applied"
	// ReasonInvalidPolicy means the operator cannot apply the policy (for
	// example an ordering this operator does not know); the lock follows
	// NewestWins until the policy is fixed.
	ReasonInvalidPolicy = "InvalidPolicy"
)

// Reasons on a BuildLockPolicy's Enforced condition.
const (
	// ReasonEnforcing means the target namespace consents and its writes
	// are fenced: the API server refused the operator's probe write, with
	// the lock's current grant. The operator probes after every change of
	// the grant and every minute.
	ReasonEnforcing = "Enforcing"
	// ReasonNotYetEnforced means the API server still admits the probe
	// write: a new binding or consent takes effect within about a second
	// (the API server's policy refresh), or the operator has not written
	// the binding yet.
	ReasonNotYetEnforced = "NotYetEnforced"
	// ReasonFenceFrozen means the API server enforces an older grant than
	// the lock's for longer than a few seconds: its informer of Lease
	// parameters stopped (enforcement's admission policies were removed
	// and installed again while no other policy used Leases). Hand-offs do
	// not move the fence until every kube-apiserver is restarted.
	ReasonFenceFrozen = "FenceFrozen"
	// ReasonGrantLeaseMissing means the API server finds no grant Lease for
	// the lock: it refuses every write into the target, from anyone, until
	// the operator has recreated it.
	ReasonGrantLeaseMissing = "GrantLeaseMissing"
	// ReasonPoliciesNotInstalled means the buildlock-enforce admission
	// policy is not installed (the chart's enforcement.enabled, or
	// config/enforcement): nothing is enforced.
	ReasonPoliciesNotInstalled = "PoliciesNotInstalled"
	// ReasonProbeFailed means the operator could not probe the fence (for
	// example, it may not impersonate EnforcementProbeUser); the message
	// says why. The condition is Unknown.
	ReasonProbeFailed = "ProbeFailed"
	// ReasonConsentMissing means the target namespace lacks the label
	// buildlock.io/locked-by=<claims namespace> (or does not exist):
	// nothing is enforced.
	ReasonConsentMissing = "ConsentMissing"
	// ReasonConflict means the target namespace consents to another claims
	// namespace's lock: this one enforces nothing.
	ReasonConflict = "Conflict"
)

// BuildLockPolicySpec is how one lock (its namespace's claims on the target
// the policy is named after) is arbitrated.
type BuildLockPolicySpec struct {
	// Ordering is how the lock chooses among waiting builds: NewestWins (the
	// default), Queue or Fifo. A change applies at once: switching to
	// NewestWins keeps the newest waiting claim and supersedes the others;
	// from Queue to Fifo every claim keeps its place; from Fifo to Queue,
	// which keeps one place per line, each line keeps its earliest place,
	// taken by its newest queued build, and its older queued builds are
	// superseded.
	// +optional
	// +kubebuilder:default=NewestWins
	Ordering Ordering `json:"ordering,omitempty"`

	// MaxHold ends any hold (pod-backed or pod-less) this long after its
	// grant, overriding the operator's --max-hold for this lock. Between 1m
	// and 168h; absent, the operator's --max-hold applies.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule=`self.matches(r'^([0-9]{1,5}(\.[0-9]{1,9})?(ns|us|ms|s|m|h)){1,4}$') && duration(self) >= duration('1m') && duration(self) <= duration('168h')`,message="spec.maxHold must be a duration between 1m and 168h, for example 2h"
	MaxHold *metav1.Duration `json:"maxHold,omitempty"`

	// Reruns says whether a new run of the build that held last for its
	// line (same build number, another run: a CI re-run or retry) may
	// deploy again once the earlier run's claim ended: Allowed (the default)
	// or Refused (a build deploys once; give a re-run a new build number).
	// +optional
	// +kubebuilder:default=Allowed
	Reruns Reruns `json:"reruns,omitempty"`

	// Rollbacks says who may roll back, with a claim's spec.rollback
	// (`kubectl buildlock acquire --rollback --reason ...`): Anyone (the
	// default: pipelines and people), PeopleOnly (verified requesters that
	// are not service accounts; needs the identity policies, and refuses
	// every rollback without them), or Nobody. A refused rollback is
	// Superseded (RollbackNotAllowed).
	// +optional
	// +kubebuilder:default=Anyone
	Rollbacks Rollbacks `json:"rollbacks,omitempty"`

	// Enforce, when set, makes the API server itself refuse writes (create,
	// update, patch, delete, exec, attach, port-forward) of objects in the
	// target namespace, and updates and deletes of the namespace itself, by
	// this namespace's pipeline service accounts and by CI identities (see
	// Enforcement), unless they come from the holder: a pod-backed holder's
	// pod (its token's pod UID is the claim's spec.podRef.uid), or a
	// pod-less holder's verified requester. While the
	// lock is free, every such write is refused. Reads are never restricted
	// (a proxy's GET included), nor are server-side dry runs, cluster-scoped
	// objects, or anybody else (people, controllers, GitOps agents, other
	// namespaces' pipelines); while the lock's grant Lease is missing, every
	// write into the target is refused, whoever sends it. The target
	// namespace must consent with the label buildlock.io/locked-by=<this
	// namespace>, which only people may set or remove; the Enforced
	// condition says Enforcing once the API server was seen to refuse, or
	// what is missing. Needs the chart's enforcement policies
	// (enforcement.enabled).
	// +optional
	Enforce *Enforcement `json:"enforce,omitempty"`

	// Windows freeze the target at times (Deny) or open it only at times
	// (Allow): while the target is frozen no claim is granted, but through
	// an override (`kubectl buildlock override`). Deny beats Allow; with
	// any Allow window the target is frozen outside every Allow window. A
	// build that holds when the target freezes keeps the lock until it
	// ends (unless its window says holder: Release); waiting claims keep
	// their place (reason Frozen) and are granted when it opens. At most
	// 32 windows; status.state says whether the target is open now.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:XValidation:rule="self.all(w, !has(w.name) || self.exists_one(v, has(v.name) && v.name == w.name))",message="the names of spec.windows must be unique"
	Windows []Window `json:"windows,omitempty"`
}

// Enforcement names the pipelines whose writes into the target namespace
// are fenced by the lock: this namespace's service accounts, and CI
// identities (OIDC tokens of GitHub Actions or GitLab CI that the API
// server authenticates and maps a repository into: RepositoryExtra).
type Enforcement struct {
	// ServiceAccounts are the names of this namespace's service accounts
	// that run pipelines; empty means all of them.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:XValidation:rule=`self.all(s, s.matches(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$'))`,message="spec.enforce.serviceAccounts must name service accounts of this namespace: lower-case letters, digits, '-' and '.', for example pipeline (not system:serviceaccount:ns:name)"
	ServiceAccounts []string `json:"serviceAccounts,omitempty"`
	// Repositories are the repositories (owner/name, GitLab's
	// group/project) whose CI identities run pipelines: a request whose
	// user extra buildlock.io/repository is one of them. Empty means every
	// CI identity, whichever repository it belongs to. A CI identity holds
	// the lock through a pod-less claim it created, and writes into the
	// target while that claim holds.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=255
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+$`
	Repositories []string `json:"repositories,omitempty"`
}

// BuildLockPolicyStatus is what the operator made of the policy.
type BuildLockPolicyStatus struct {
	// ObservedGeneration is the metadata.generation the conditions describe.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions hold the Ready and IdentityVerified conditions, and with
	// spec.enforce the Enforced and Bypassable conditions.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// State is Open or Frozen: whether claims on the target are granted
	// now, by spec.windows (Open without windows).
	// +optional
	State WindowState `json:"state,omitempty"`

	// ActiveWindows are the windows in effect: Deny windows first, then
	// Allow windows, each kind the longest-lasting first.
	// +optional
	// +listType=atomic
	ActiveWindows []ActiveWindow `json:"activeWindows,omitempty"`

	// NextChange is when state changes next (for a frozen target, when it
	// opens); absent when it does not change within the operator's
	// look-ahead (a year).
	// +optional
	NextChange *metav1.Time `json:"nextChange,omitempty"`

	// Bypasses name, for a policy with spec.enforce, the fenced pipeline
	// identities whose RBAC rights let them write into the target around
	// the fence, as the operator's last audit found them (the Bypassable
	// condition says how to close it): at most 32, in name order.
	// +optional
	// +listType=map
	// +listMapKey=identity
	// +kubebuilder:validation:MaxItems=32
	Bypasses []FenceBypass `json:"bypasses,omitempty"`
}

// BuildLockPolicy chooses how one lock is arbitrated. It lives in the
// claims' namespace and is named after the target it governs, so there is
// at most one per lock; without one, a lock follows NewestWins and the
// operator's flags. Pipelines may read policies; only administrators should
// write them.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=blp,categories=buildlock-all
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be the target this policy governs: a namespace name (a DNS-1123 label of at most 63 characters)"
// +kubebuilder:printcolumn:name="Ordering",type=string,JSONPath=`.spec.ordering`
// +kubebuilder:printcolumn:name="Max Hold",type=string,JSONPath=`.spec.maxHold`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Next Change",type=string,JSONPath=`.status.nextChange`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.activeWindows[0].reason`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Enforced",type=string,JSONPath=`.status.conditions[?(@.type=="Enforced")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Window",type=string,JSONPath=`.status.activeWindows[0].name`,priority=1
type BuildLockPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec BuildLockPolicySpec `json:"spec,omitempty"`

	// +optional
	Status BuildLockPolicyStatus `json:"status,omitempty"`
}

// BuildLockPolicyList is a list of BuildLockPolicies.
//
// +kubebuilder:object:root=true
type BuildLockPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BuildLockPolicy `json:"items"`
}
