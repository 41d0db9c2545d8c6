package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Phase is where a claim stands in its lock's arbitration.
// +kubebuilder:validation:Enum=Pending;Waiting;Held;Superseded;Released;Expired
type Phase string

const (
	// PhasePending means the operator has not decided on this claim yet. Can
	// transition to any other phase.
	PhasePending Phase = "Pending"
	// PhaseWaiting means this claim waits for the lock: with the NewestWins
	// ordering it has the lock's single waiting slot; with Queue and Fifo it
	// has a place in the lock's queue (status.queuedAt). Can transition to
	// Held, Superseded or Released (or Expired, when it was granted but its
	// Held status was never written before the hold ran out).
	PhaseWaiting Phase = "Waiting"
	// PhaseHeld means this claim holds the lock; its build may deploy. Can transition
	// to Released or Expired.
	PhaseHeld Phase = "Held"
	// PhaseSuperseded means a newer build made this claim obsolete, or its
	// build may not deploy on its line (reasons DuplicateBuild,
	// LineOwnedByOther, BuildJumpTooLarge, RollbackNotAllowed); its build
	// should stop without deploying. Terminal.
	PhaseSuperseded Phase = "Superseded"
	// PhaseReleased means the claim ended because its pod finished or disappeared,
	// a person force-released it, or it was deleted while a finalizer kept
	// it. Terminal.
	PhaseReleased Phase = "Released"
	// PhaseExpired means a pod-less holder was not renewed within expiresAfter,
	// or a holder exceeded its maximum hold (the operator's --max-hold, or
	// the BuildLockPolicy's spec.maxHold). Terminal.
	PhaseExpired Phase = "Expired"
)

// IsTerminal reports whether a claim in this phase can never change again.
func (p Phase) IsTerminal() bool {
	return p == PhaseSuperseded || p == PhaseReleased || p == PhaseExpired
}

// ConditionAcquired is True while the claim holds its lock, so that a
// pipeline can `kubectl wait --for=condition=Acquired`. It is False with the
// claim's reason in every other phase.
const ConditionAcquired = "Acquired"

// ConditionDecided is True once the operator's verdict on the claim is
// final for the pipeline: the claim holds the lock (Held), or it ended
// (Superseded, Released, Expired). It is False while the claim is Pending
// or Waiting. Its reason is the claim's. One
// `kubectl wait --for=condition=Decided` returns on either outcome; then
// status.phase says which (a pipeline deploys only on Held).
const ConditionDecided = "Decided"

// Reasons set on status.reason and on the Acquired condition.
const (
	// ReasonPending means the operator has not arbitrated this claim yet.
	ReasonPending = "Pending"
	// ReasonForeignLease keeps a claim Pending while its lock's grant Lease
	// name (buildlock-<target>) is taken by a Lease that buildlock did not
	// create (it carries no app.kubernetes.io/managed-by=buildlock label and
	// no buildlock.io/ label or annotation): the operator never takes such a
	// Lease over, nor writes it in a loop. The claim proceeds once that
	// Lease is deleted; the operator looks again every minute, and on any
	// event of the lock's claims. On a BuildLockPolicy's Enforced condition
	// (False), it says the same Lease keeps the target from being fenced.
	ReasonForeignLease = "ForeignLease"
	// ReasonAcquired means the claim holds the lock.
	ReasonAcquired = "Acquired"
	// ReasonWaitingForHolder means the claim has the waiting slot (ordering
	// NewestWins).
	ReasonWaitingForHolder = "WaitingForHolder"
	// ReasonQueued means the claim has a place in the lock's queue (orderings
	// Queue and Fifo); its message names the claim directly ahead of it.
	ReasonQueued = "Queued"
	// ReasonSupersededByNewerBuild means a newer build of the same line
	// (repository, branch and workflow), or (ordering NewestWins) a newer
	// build of another line that won the waiting slot, made this claim
	// obsolete; or a higher build of its line already held the lock since
	// the line's last rollback (a build never deploys backwards unless it is
	// a rollback).
	ReasonSupersededByNewerBuild = "SupersededByNewerBuild"
	// ReasonDuplicateBuild means another run of the same build (same line
	// and build number) was there first and still waits or holds: two runs
	// of one build never deploy at once. Or the build already held the lock
	// and the BuildLockPolicy refuses re-runs (spec.reruns: Refused).
	ReasonDuplicateBuild = "DuplicateBuild"
	// ReasonLineOwnedByOther (phase Superseded) means the claim's branch
	// (repository and branch, whatever the workflow) belongs to another
	// pipeline (service account or CI identity): the verified requester
	// (spec.requester) of the latest build of any of the branch's lines
	// that held the lock within the grant retention. A pipeline's claim of
	// a branch another pipeline held last never deploys, whatever its
	// build; a person's claim may (and frees the branch). Only with the
	// identity policies installed, which stamp spec.requester.
	ReasonLineOwnedByOther = "LineOwnedByOther"
	// ReasonLineMemoryFull (phase Waiting) means the claim's line is new to
	// the lock and the grant record's memory of lines has no room for it:
	// it is full (96 KiB), or the lines held as the claim's requester fill
	// that identity's share (24 KiB). A build whose line would not be
	// remembered is not granted, since a lower build of its line could
	// deploy after it once its claim is gone. The claim keeps its place and
	// is granted once records leave the memory (after the grant retention)
	// and make room; claims of lines the lock remembers go meanwhile.
	ReasonLineMemoryFull = "LineMemoryFull"
	// ReasonRollbackNotAllowed (phase Superseded) means the claim is a
	// rollback (spec.rollback) and its lock's BuildLockPolicy does not allow
	// rollbacks from its requester: spec.rollbacks is Nobody, or PeopleOnly
	// and the claim's verified requester is a service account or unknown
	// (without the identity admission policies that stamp spec.requester, no
	// requester is verified, and PeopleOnly refuses every rollback).
	ReasonRollbackNotAllowed = "RollbackNotAllowed"
	// ReasonBuildJumpTooLarge (phase Superseded) means the claim's build is
	// more than the operator's --max-build-jump (default
	// DefaultMaxBuildJump) above the highest build of its line that held
	// the lock within the grant retention. It bounds how far a claim can
	// push a line's "never backwards" memory. People's claims (a verified
	// requester that is not a service account) are exempt.
	ReasonBuildJumpTooLarge = "BuildJumpTooLarge"
	// ReasonPodFinished means the claim's pod reached Succeeded or Failed.
	ReasonPodFinished = "PodFinished"
	// ReasonPodGone means the claim's pod does not exist, or has another UID.
	ReasonPodGone = "PodGone"
	// ReasonLockLost means the grant record no longer names this claim although it
	// was shown as holding, and records no other ending for it (the grant was
	// changed outside this claim's life).
	ReasonLockLost = "LockLost"
	// ReasonExpired means a pod-less holder was not renewed in time, or
	// was renewed with a spec.renewTime so far in the past that, counted
	// from it, the hold had ended already (the message says which).
	ReasonExpired = "Expired"
	// ReasonMaxHoldExceeded means a holder held longer than its maximum hold
	// (the BuildLockPolicy's spec.maxHold, else the operator's --max-hold).
	ReasonMaxHoldExceeded = "MaxHoldExceeded"
	// ReasonForceReleased means a person ended the claim with the
	// ForceReleaseAnnotation (`kubectl buildlock force-release`).
	ReasonForceReleased = "ForceReleased"
	// ReasonDeleted (phase Released) means the claim was deleted while a
	// finalizer kept it: a claim being deleted has ended, holder or waiter,
	// and the lock goes on without it.
	ReasonDeleted = "Deleted"
)

// PodReference names the pipeline pod that runs the build, in the claim's
// namespace. While it is Pending, Running or Unknown the build is alive.
type PodReference struct {
	// Name of the pod, in the BuildLock's namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule=`self.matches(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')`,message="spec.podRef.name must be the name of a pod in this BuildLock's namespace: lower-case letters, digits, '-' and '.', for example shop-42-deploy (no namespace/ prefix)"
	Name string `json:"name"`

	// UID of the pod. When set, a pod of the same name with another UID counts
	// as gone (the build's pod was replaced).
	// +optional
	// +kubebuilder:validation:MaxLength=36
	// +kubebuilder:validation:XValidation:rule=`self.matches(r'^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$')`,message="spec.podRef.uid must be the pod's metadata.uid, a UUID such as 0f9c4e2a-7b1d-4c3e-9a5f-123456789abc"
	UID string `json:"uid,omitempty"`
}

// BuildLockSpec is one build's claim on one deploy target. Every field but
// renewTime is fixed at creation.
//
// The API server evaluates every rule of the whole object on each status
// write, the operator's most frequent request: the rules on a change of the
// spec are one rule (one evaluation), whose message names each field that
// changed.
// +kubebuilder:validation:XValidation:rule=`self.target == oldSelf.target && self.repo == oldSelf.repo && self.branch == oldSelf.branch && self.build == oldSelf.build && (has(self.podRef) == has(oldSelf.podRef) && (!has(self.podRef) || self.podRef == oldSelf.podRef)) && (has(self.timestamp) == has(oldSelf.timestamp) && (!has(self.timestamp) || timestamp(self.timestamp) == timestamp(oldSelf.timestamp))) && (has(self.expiresAfter) == has(oldSelf.expiresAfter) && (!has(self.expiresAfter) || duration(self.expiresAfter) == duration(oldSelf.expiresAfter))) && (!has(oldSelf.renewTime) || (has(self.renewTime) && timestamp(self.renewTime) >= timestamp(oldSelf.renewTime))) && (has(self.requester) == has(oldSelf.requester) && (!has(self.requester) || self.requester == oldSelf.requester)) && (has(self.workflow) == has(oldSelf.workflow) && (!has(self.workflow) || self.workflow == oldSelf.workflow)) && (has(self.rollback) == has(oldSelf.rollback) && (!has(self.rollback) || self.rollback == oldSelf.rollback))`,messageExpression=`(((self.target == oldSelf.target) ? "" : '; spec.target is immutable: delete this BuildLock and create a new one') + ((self.repo == oldSelf.repo) ? "" : '; spec.repo is immutable: delete this BuildLock and create a new one') + ((self.branch == oldSelf.branch) ? "" : '; spec.branch is immutable: delete this BuildLock and create a new one') + ((self.build == oldSelf.build) ? "" : '; spec.build is immutable: delete this BuildLock and create a new one') + ((has(self.podRef) == has(oldSelf.podRef) && (!has(self.podRef) || self.podRef == oldSelf.podRef)) ? "" : '; spec.podRef is immutable: delete this BuildLock and create a new one') + ((has(self.timestamp) == has(oldSelf.timestamp) && (!has(self.timestamp) || timestamp(self.timestamp) == timestamp(oldSelf.timestamp))) ? "" : '; spec.timestamp is immutable: delete this BuildLock and create a new one') + ((has(self.expiresAfter) == has(oldSelf.expiresAfter) && (!has(self.expiresAfter) || duration(self.expiresAfter) == duration(oldSelf.expiresAfter))) ? "" : '; spec.expiresAfter is immutable: delete this BuildLock and create a new one') + ((!has(oldSelf.renewTime) || (has(self.renewTime) && timestamp(self.renewTime) >= timestamp(oldSelf.renewTime))) ? "" : '; spec.renewTime may only move forward: set it to the current time, never earlier than its last value, and never remove it') + ((has(self.requester) == has(oldSelf.requester) && (!has(self.requester) || self.requester == oldSelf.requester)) ? "" : '; spec.requester is stamped by the API server when the BuildLock is created and is immutable') + ((has(self.workflow) == has(oldSelf.workflow) && (!has(self.workflow) || self.workflow == oldSelf.workflow)) ? "" : '; spec.workflow is immutable: delete this BuildLock and create a new one') + ((has(self.rollback) == has(oldSelf.rollback) && (!has(self.rollback) || self.rollback == oldSelf.rollback)) ? "" : '; spec.rollback is immutable: delete this BuildLock and create a new one')).substring(2)`,message="spec fields are immutable but renewTime, which may only move forward: delete this BuildLock and create a new one"
// +kubebuilder:validation:XValidation:rule="!has(self.podRef) || !has(self.expiresAfter)",message="spec.expiresAfter applies only to claims without spec.podRef: a claim with a pod holds while its pod runs (bound it with the operator's --max-hold or a BuildLockPolicy's spec.maxHold); remove expiresAfter"
type BuildLockSpec struct {
	// Target is the namespace the build deploys into. Claims in the same
	// namespace with the same target contend for one lock.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule=`self.matches(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')`,message="spec.target must be a namespace name: lower-case letters, digits and '-', beginning and ending with a letter or digit, for example staging"
	Target string `json:"target"`

	// Repo is the repository the build comes from, as owner/name (GitLab's
	// nested groups, group/subgroup/name, are accepted too).
	// +required
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:XValidation:rule=`self.matches(r'^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+$')`,message="spec.repo must be owner/name (GitLab: group/subgroup/name), each part of letters, digits, '_', '.' and '-', for example acme/shop; not a URL"
	Repo string `json:"repo"`

	// Branch is the branch (or other ref) that was built. Control and
	// invisible characters, bidirectional marks and overrides, and line
	// separators are refused (TextForbiddenChars): the branch names a line,
	// and is printed by kubectl and in every message about the build.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:XValidation:rule=`!self.matches(r'[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\x{034F}\x{115F}\x{1160}\x{17B4}\x{17B5}\x{3164}\x{FFA0}]')`,messageExpression=`[self.find(r'[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\x{034F}\x{115F}\x{1160}\x{17B4}\x{17B5}\x{3164}\x{FFA0}]')].map(c, [string(self.indexOf(c) + 1)].map(i, ['%x'.format([bytes(c)])].map(h, [[0, 1, 2, 3].filter(k, 2 * k < size(h)).map(k, '0123456789abcdef'.indexOf(h.charAt(2 * k)) * 16 + '0123456789abcdef'.indexOf(h.charAt(2 * k + 1)))].map(b, [size(b) == 1 ? b[0] : size(b) == 2 ? (b[0] - 192) * 64 + b[1] - 128 : size(b) == 3 ? (b[0] - 224) * 4096 + (b[1] - 128) * 64 + b[2] - 128 : (b[0] - 240) * 262144 + (b[1] - 128) * 4096 + (b[2] - 128) * 64 + b[3] - 128].map(p, 'spec.branch must not contain invisible, bidirectional or control characters: it has U+' + (p >= 1048576 ? ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 1048576 % 16] : '') + (p >= 65536 ? ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 65536 % 16] : '') + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 4096 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 256 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 16 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p % 16] + ' at character ' + i + '; write it without that character')[0])[0])[0])[0])[0]`,message="spec.branch must not contain invisible, bidirectional or control characters (zero-width spaces, bidirectional marks and overrides, line separators, newlines, tabs)"
	Branch string `json:"branch"`

	// Build is the build number within repo and branch; a higher number is a
	// newer build of the same line. At most 2^53-1.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=9007199254740991
	Build int64 `json:"build"`

	// Workflow is what the CI system numbers builds in, where that is less
	// than the repository: GitHub Actions counts run numbers per workflow
	// (GITHUB_WORKFLOW_REF without its @ref), Jenkins build numbers per job,
	// Tekton per pipeline. A line is repo, branch and workflow: the builds
	// of two workflows of one repository and branch are never compared. The
	// plugin and the integrations fill it in; a claim without it is of the
	// line of repo and branch alone, as claims were before it existed.
	// Unless the API server verified it (spec.requester.workflow, from a CI
	// identity's token), it is free text, and the claim is judged by its
	// branch's line without a workflow too. The characters TextForbiddenChars
	// names are refused.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:XValidation:rule=`!self.matches(r'[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\x{034F}\x{115F}\x{1160}\x{17B4}\x{17B5}\x{3164}\x{FFA0}]')`,messageExpression=`[self.find(r'[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\x{034F}\x{115F}\x{1160}\x{17B4}\x{17B5}\x{3164}\x{FFA0}]')].map(c, [string(self.indexOf(c) + 1)].map(i, ['%x'.format([bytes(c)])].map(h, [[0, 1, 2, 3].filter(k, 2 * k < size(h)).map(k, '0123456789abcdef'.indexOf(h.charAt(2 * k)) * 16 + '0123456789abcdef'.indexOf(h.charAt(2 * k + 1)))].map(b, [size(b) == 1 ? b[0] : size(b) == 2 ? (b[0] - 192) * 64 + b[1] - 128 : size(b) == 3 ? (b[0] - 224) * 4096 + (b[1] - 128) * 64 + b[2] - 128 : (b[0] - 240) * 262144 + (b[1] - 128) * 4096 + (b[2] - 128) * 64 + b[3] - 128].map(p, 'spec.workflow must not contain invisible, bidirectional or control characters: it has U+' + (p >= 1048576 ? ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 1048576 % 16] : '') + (p >= 65536 ? ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 65536 % 16] : '') + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 4096 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 256 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 16 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p % 16] + ' at character ' + i + '; write it without that character')[0])[0])[0])[0])[0]`,message="spec.workflow must not contain invisible, bidirectional or control characters (zero-width spaces, bidirectional marks and overrides, line separators, newlines, tabs)"
	Workflow string `json:"workflow,omitempty"`

	// Rollback, when set, makes this claim a rollback on purpose: it may
	// deploy a build at or below one of its line that already held the lock
	// (it is exempt from "never backwards", and from nothing else: it waits
	// for the holder, in its turn), and its grant lowers the line's memory
	// to its build, so that the line's next build deploys normally. Whether
	// a rollback is allowed, and from whom, is its lock's BuildLockPolicy's
	// spec.rollbacks (default Anyone); a refused one is Superseded
	// (RollbackNotAllowed). Its reason, with spec.requester, is recorded in
	// the hold's event, in buildlock_rollbacks_total and in the grant
	// record's audit (buildlock.io/audit), which outlives the claim.
	// +optional
	Rollback *Rollback `json:"rollback,omitempty"`

	// PodRef names the pipeline's pod in this namespace. While it runs, the
	// build is alive; when it finishes or disappears, the claim ends.
	//
	// The operator cannot tell whether the pod really runs this build: a
	// podRef naming some other long-running pod of the namespace keeps the
	// claim alive as long as that pod. Bound every hold with the operator's
	// --max-hold (or a BuildLockPolicy's spec.maxHold).
	// +optional
	PodRef *PodReference `json:"podRef,omitempty"`

	// Timestamp is when the build started; it orders builds of different
	// lines (ordering NewestWins: the newer wins the waiting slot). When
	// absent, the BuildLock's creationTimestamp stands in. A timestamp later
	// than the creationTimestamp plus the operator's --max-timestamp-skew
	// (an allowance for clock skew, 5 seconds by default) counts as
	// creationTimestamp plus that allowance: no claim can rank newer than
	// claims created after it by stamping itself in the future. Any RFC
	// 3339 time, for example 2026-11-30T22:45:00Z.
	// +optional
	Timestamp *Timestamp `json:"timestamp,omitempty"`

	// ExpiresAfter applies only to claims without podRef (and is refused on a
	// claim with one): how long a holder keeps the lock after it was granted
	// or last renewed (spec.renewTime). Between 10s and 24h; 1h when absent.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:XValidation:rule=`self.matches(r'^([0-9]{1,5}(\.[0-9]{1,9})?(ns|us|ms|s|m|h)){1,4}$') && duration(self) >= duration('10s') && duration(self) <= duration('24h')`,message="spec.expiresAfter must be a duration between 10s and 24h, for example 30m"
	ExpiresAfter *metav1.Duration `json:"expiresAfter,omitempty"`

	// RenewTime is bumped by a pod-less holder's client to keep the lock. A
	// renewal counts from when the operator observed it (status.renewedAt),
	// or from renewTime if that is earlier: a clock in the future extends
	// nothing. The hold expires at max(acquiredAt, renewedAt) + expiresAfter,
	// and never later than the maximum hold. It may only move forward. It is
	// the one field that may change after creation. Any RFC 3339 time.
	// +optional
	RenewTime *Timestamp `json:"renewTime,omitempty"`

	// Requester is who created this BuildLock, stamped by the API server's
	// buildlock-requester MutatingAdmissionPolicy (part of every
	// installation) from the request's authenticated identity: never set it
	// yourself. An enforced lock admits a pod-less holder's writes from this
	// identity only, and pipelines may change or delete only the claims they
	// created. The operator takes it as verified, and binds lines to it
	// (reason LineOwnedByOther), only on claims created at least 30 seconds
	// after that policy and its binding, while both exist: before, a
	// client could have written it.
	// +optional
	Requester *Requester `json:"requester,omitempty"`
}

// Rollback says why a claim rolls back.
type Rollback struct {
	// Reason says why, for the people who read the audit: an incident, a
	// ticket. At most 256 characters, without the characters
	// TextForbiddenChars names.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule=`self.matches(r'\S')`,message="spec.rollback.reason must say why the build rolls back (an incident, a ticket): it is blank"
	// +kubebuilder:validation:XValidation:rule=`!self.matches(r'[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\x{034F}\x{115F}\x{1160}\x{17B4}\x{17B5}\x{3164}\x{FFA0}]')`,messageExpression=`[self.find(r'[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\x{034F}\x{115F}\x{1160}\x{17B4}\x{17B5}\x{3164}\x{FFA0}]')].map(c, [string(self.indexOf(c) + 1)].map(i, ['%x'.format([bytes(c)])].map(h, [[0, 1, 2, 3].filter(k, 2 * k < size(h)).map(k, '0123456789abcdef'.indexOf(h.charAt(2 * k)) * 16 + '0123456789abcdef'.indexOf(h.charAt(2 * k + 1)))].map(b, [size(b) == 1 ? b[0] : size(b) == 2 ? (b[0] - 192) * 64 + b[1] - 128 : size(b) == 3 ? (b[0] - 224) * 4096 + (b[1] - 128) * 64 + b[2] - 128 : (b[0] - 240) * 262144 + (b[1] - 128) * 4096 + (b[2] - 128) * 64 + b[3] - 128].map(p, 'spec.rollback.reason must not contain invisible, bidirectional or control characters: it has U+' + (p >= 1048576 ? ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 1048576 % 16] : '') + (p >= 65536 ? ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 65536 % 16] : '') + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 4096 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 256 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 16 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p % 16] + ' at character ' + i + '; write it without that character')[0])[0])[0])[0])[0]`,message="spec.rollback.reason must not contain invisible, bidirectional or control characters (zero-width spaces, bidirectional marks and overrides, line separators, newlines, tabs)"
	Reason string `json:"reason"`
}

// Requester is the authenticated identity that created a BuildLock. It is
// atomic: an admission policy that sets it replaces it whole, so that no
// field a client sent survives.
// +structType=atomic
type Requester struct {
	// Username is the requester's user name, e.g.
	// system:serviceaccount:ci:pipeline.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule=`!self.matches(r'[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\x{034F}\x{115F}\x{1160}\x{17B4}\x{17B5}\x{3164}\x{FFA0}]')`,messageExpression=`[self.find(r'[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\x{034F}\x{115F}\x{1160}\x{17B4}\x{17B5}\x{3164}\x{FFA0}]')].map(c, [string(self.indexOf(c) + 1)].map(i, ['%x'.format([bytes(c)])].map(h, [[0, 1, 2, 3].filter(k, 2 * k < size(h)).map(k, '0123456789abcdef'.indexOf(h.charAt(2 * k)) * 16 + '0123456789abcdef'.indexOf(h.charAt(2 * k + 1)))].map(b, [size(b) == 1 ? b[0] : size(b) == 2 ? (b[0] - 192) * 64 + b[1] - 128 : size(b) == 3 ? (b[0] - 224) * 4096 + (b[1] - 128) * 64 + b[2] - 128 : (b[0] - 240) * 262144 + (b[1] - 128) * 4096 + (b[2] - 128) * 64 + b[3] - 128].map(p, 'spec.requester.username must not contain invisible, bidirectional or control characters: it has U+' + (p >= 1048576 ? ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 1048576 % 16] : '') + (p >= 65536 ? ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 65536 % 16] : '') + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 4096 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 256 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 16 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p % 16] + ' at character ' + i + '; write it without that character')[0])[0])[0])[0])[0]`,message="spec.requester.username must not contain invisible, bidirectional or control characters (zero-width spaces, bidirectional marks and overrides, line separators, newlines, tabs)"
	Username string `json:"username,omitempty"`
	// PodName and PodUID name the pod a service account's pod-bound token
	// came from, when it did.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	PodName string `json:"podName,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=36
	PodUID string `json:"podUID,omitempty"`
	// Repository is the repository (owner/name, GitLab's group/project)
	// that the requester's CI identity belongs to: the API server
	// authenticated a CI system's OIDC token (GitHub Actions, GitLab CI)
	// and mapped its repository into the user's extra
	// buildlock.io/repository (RepositoryExtra). Such a requester is a
	// pipeline, as a service account is, and claims for that repository
	// only. Empty for every other identity.
	// +optional
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:XValidation:rule=`!self.matches(r'[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\x{034F}\x{115F}\x{1160}\x{17B4}\x{17B5}\x{3164}\x{FFA0}]')`,messageExpression=`[self.find(r'[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\x{034F}\x{115F}\x{1160}\x{17B4}\x{17B5}\x{3164}\x{FFA0}]')].map(c, [string(self.indexOf(c) + 1)].map(i, ['%x'.format([bytes(c)])].map(h, [[0, 1, 2, 3].filter(k, 2 * k < size(h)).map(k, '0123456789abcdef'.indexOf(h.charAt(2 * k)) * 16 + '0123456789abcdef'.indexOf(h.charAt(2 * k + 1)))].map(b, [size(b) == 1 ? b[0] : size(b) == 2 ? (b[0] - 192) * 64 + b[1] - 128 : size(b) == 3 ? (b[0] - 224) * 4096 + (b[1] - 128) * 64 + b[2] - 128 : (b[0] - 240) * 262144 + (b[1] - 128) * 4096 + (b[2] - 128) * 64 + b[3] - 128].map(p, 'spec.requester.repository must not contain invisible, bidirectional or control characters: it has U+' + (p >= 1048576 ? ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 1048576 % 16] : '') + (p >= 65536 ? ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 65536 % 16] : '') + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 4096 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 256 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 16 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p % 16] + ' at character ' + i + '; write it without that character')[0])[0])[0])[0])[0]`,message="spec.requester.repository must not contain invisible, bidirectional or control characters (zero-width spaces, bidirectional marks and overrides, line separators, newlines, tabs)"
	Repository string `json:"repository,omitempty"`
	// Workflow is the workflow that the requester's CI identity's token
	// names, when the authenticator maps one into the user's extra
	// buildlock.io/workflow (WorkflowExtra): GitHub's workflow_ref without
	// its @ref, e.g. acme/shop/.github/workflows/deploy.yml. The
	// claim-identity policy refuses a claim of such an identity whose
	// spec.workflow is another, so the claim's workflow is verified: its
	// build numbers are its own. Empty for every other identity.
	// +optional
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:XValidation:rule=`!self.matches(r'[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\x{034F}\x{115F}\x{1160}\x{17B4}\x{17B5}\x{3164}\x{FFA0}]')`,messageExpression=`[self.find(r'[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\x{034F}\x{115F}\x{1160}\x{17B4}\x{17B5}\x{3164}\x{FFA0}]')].map(c, [string(self.indexOf(c) + 1)].map(i, ['%x'.format([bytes(c)])].map(h, [[0, 1, 2, 3].filter(k, 2 * k < size(h)).map(k, '0123456789abcdef'.indexOf(h.charAt(2 * k)) * 16 + '0123456789abcdef'.indexOf(h.charAt(2 * k + 1)))].map(b, [size(b) == 1 ? b[0] : size(b) == 2 ? (b[0] - 192) * 64 + b[1] - 128 : size(b) == 3 ? (b[0] - 224) * 4096 + (b[1] - 128) * 64 + b[2] - 128 : (b[0] - 240) * 262144 + (b[1] - 128) * 4096 + (b[2] - 128) * 64 + b[3] - 128].map(p, 'spec.requester.workflow must not contain invisible, bidirectional or control characters: it has U+' + (p >= 1048576 ? ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 1048576 % 16] : '') + (p >= 65536 ? ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 65536 % 16] : '') + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 4096 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 256 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 16 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p % 16] + ' at character ' + i + '; write it without that character')[0])[0])[0])[0])[0]`,message="spec.requester.workflow must not contain invisible, bidirectional or control characters (zero-width spaces, bidirectional marks and overrides, line separators, newlines, tabs)"
	Workflow string `json:"workflow,omitempty"`
	// Run is the CI run that the requester's CI identity's token was issued
	// to, when the authenticator maps one into the user's extra
	// buildlock.io/run (RunExtra): GitHub's run id and attempt, GitLab's job
	// id. An enforced lock admits a pod-less holder's writes from that run
	// only, and only that run may change or delete the claim.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9._/:-]+$`
	Run string `json:"run,omitempty"`
}

// BuildLockStatus is the operator's verdict on the claim. Only the operator
// writes it.
type BuildLockStatus struct {
	// Phase is where the claim stands: Pending, Waiting, Held, Superseded,
	// Released or Expired.
	// +optional
	Phase Phase `json:"phase,omitempty"`

	// Holder is the name of the BuildLock that holds this target now (as of
	// this claim's last update; a terminal claim keeps the picture it ended
	// with). Empty on a claim queued with the orderings Queue and Fifo: the
	// holder changes with every hand-off, and a queued claim's status is not
	// rewritten for each; its message names the claim directly ahead.
	// +optional
	Holder string `json:"holder,omitempty"`

	// Waiting is the name of the BuildLock that has the waiting slot now, or
	// with Queue and Fifo the first in the queue, as of this claim's last
	// update. Empty on queued claims and on the holder: a new waiter does
	// not rewrite the holder's status (`kubectl buildlock status` and
	// `kubectl get buildlocks -o wide` show who waits).
	// +optional
	Waiting string `json:"waiting,omitempty"`

	// FencingToken is the grant number of this claim's hold: it increases with
	// every grant of the target and is never reused. Pass it to the systems
	// you deploy to, so that they can refuse a stale holder.
	// +optional
	FencingToken int64 `json:"fencingToken,omitempty"`

	// AcquiredAt is when this claim was granted the lock.
	// +optional
	AcquiredAt *metav1.MicroTime `json:"acquiredAt,omitempty"`

	// ExpiresAt is when the hold ends: for a pod-less hold unless
	// spec.renewTime is bumped; for any hold, at the latest its maximum hold.
	// +optional
	ExpiresAt *metav1.MicroTime `json:"expiresAt,omitempty"`

	// RenewedAt is when the operator observed the latest spec.renewTime (or
	// renewTime itself, if that is earlier): the instant a pod-less hold's
	// renewal counts from.
	// +optional
	RenewedAt *metav1.MicroTime `json:"renewedAt,omitempty"`

	// QueuedAt is the claim's place in the lock's queue: when it (or, with
	// the ordering Queue, the build of its line it replaced) started waiting.
	// Waiting claims are granted in the order of queuedAt (orderings Queue
	// and Fifo). It is stored so that a restart never reorders the queue.
	// +optional
	QueuedAt *metav1.MicroTime `json:"queuedAt,omitempty"`

	// FinishedAt is when the claim reached a terminal phase. Finished claims
	// are deleted by the operator after its --finished-ttl.
	// +optional
	FinishedAt *metav1.MicroTime `json:"finishedAt,omitempty"`

	// SupersededBy names the BuildLock that made this claim obsolete.
	// +optional
	SupersededBy string `json:"supersededBy,omitempty"`

	// Reason is a CamelCase word for why the claim is in its phase.
	// +optional
	Reason string `json:"reason,omitempty"`

	// Message says, for a person, why the claim is in its phase and what
	// happens next.
	// +optional
	Message string `json:"message,omitempty"`

	// ObservedGeneration is the metadata.generation this status was computed
	// from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions hold the Acquired and Decided conditions.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// BuildLock is one build's claim on a deploy target. The operator arbitrates
// all claims with the same namespace and spec.target: one holds, one waits,
// the others are superseded by newer builds.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=bl,categories=buildlock-all
// +kubebuilder:selectablefield:JSONPath=`.spec.target`
// +kubebuilder:printcolumn:name="Target",type=string,JSONPath=`.spec.target`
// +kubebuilder:printcolumn:name="Repo",type=string,JSONPath=`.spec.repo`
// +kubebuilder:printcolumn:name="Branch",type=string,JSONPath=`.spec.branch`
// +kubebuilder:printcolumn:name="Build",type=integer,JSONPath=`.spec.build`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Holder",type=string,JSONPath=`.status.holder`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Waiting",type=string,JSONPath=`.status.waiting`,priority=1
// +kubebuilder:printcolumn:name="Token",type=integer,JSONPath=`.status.fencingToken`,priority=1
// +kubebuilder:printcolumn:name="Pod",type=string,JSONPath=`.spec.podRef.name`,priority=1
// +kubebuilder:printcolumn:name="Queued",type=date,JSONPath=`.status.queuedAt`,priority=1
// +kubebuilder:printcolumn:name="Workflow",type=string,JSONPath=`.spec.workflow`,priority=1
type BuildLock struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec BuildLockSpec `json:"spec"`

	// +optional
	Status BuildLockStatus `json:"status,omitempty"`
}

// BuildLockList is a list of BuildLocks.
//
// +kubebuilder:object:root=true
type BuildLockList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BuildLock `json:"items"`
}
