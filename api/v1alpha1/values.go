package v1alpha1

import "time"

// The API's defaults, bounds and patterns, in one place. The CRD markers on
// the types repeat the patterns and bounds literally (controller-gen reads
// only literals); a test checks that the generated CRD and these values agree,
// so that every client (the arbiter, pkg/lock, the kubectl plugin) can
// validate exactly as the API server does.

// Defaults and bounds of spec.expiresAfter (pod-less claims only).
const (
	// DefaultExpiresAfter is how long a pod-less hold lasts after its grant
	// or last renewal when spec.expiresAfter is absent.
	DefaultExpiresAfter = time.Hour
	// MinExpiresAfter and MaxExpiresAfter bound spec.expiresAfter.
	MinExpiresAfter = 10 * time.Second
	MaxExpiresAfter = 24 * time.Hour
)

// MaxTimestampSkew is the default of the operator's --max-timestamp-skew:
// how far after its creation a claim's spec.timestamp may place it. A build
// cannot have started after its claim was created, so a later timestamp can
// only be a client's clock running ahead of the API server's; beyond this
// allowance the claim is ordered as if stamped creationTimestamp + the
// allowance. A far-future timestamp therefore wins no contest against claims
// created more than the allowance after it. Ten seconds covers clocks kept
// by NTP with room to spare (a creationTimestamp has whole seconds, which
// takes up to one of them).
const MaxTimestampSkew = 10 * time.Second

// DefaultGrantRetention is the default of the operator's --grant-retention:
// how long a lock's grant record remembers which builds of each line held
// the lock (a lower build never deploys after a higher one within it), and
// how long the grant Lease of a target without claims is kept.
const DefaultGrantRetention = 24 * time.Hour

// DefaultMaxBuildJump is the default of the operator's --max-build-jump: how
// far above the highest build of its line that held the lock (within the
// grant retention) a claim that is not a person's may go (reason
// BuildJumpTooLarge).
const DefaultMaxBuildJump = 1000

// Bounds of the policy's spec.maxHold.
const (
	MinMaxHold = time.Minute
	MaxMaxHold = 7 * 24 * time.Hour
)

// Length bounds of the spec's strings, as the CRD enforces them.
const (
	MaxTargetLength  = 63
	MinRepoLength    = 3
	MaxRepoLength    = 255
	MaxBranchLength  = 255
	MaxPodNameLength = 253
	MaxPodUIDLength  = 36
	// MaxBuild bounds spec.build: the largest integer that every JSON client
	// (JavaScript's included) reads exactly.
	MaxBuild = 1<<53 - 1
)

// Patterns of the spec's strings, as the CRD enforces them (Go regexp and
// the API server's CEL/OpenAPI patterns accept the same strings for these).
const (
	// TargetPattern is a DNS-1123 label: a namespace name.
	TargetPattern = `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// RepoPattern is owner/name, or GitLab's group/subgroup/name.
	RepoPattern = `^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+$`
	// PodNamePattern is a DNS-1123 subdomain: a pod name.
	PodNamePattern = `^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// PodUIDPattern is a UUID, as Kubernetes assigns pod UIDs.
	PodUIDPattern = `^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`
	// BranchForbiddenChars is the character class (without brackets) that
	// spec.branch refuses: control characters (C0, DEL, C1) and the Unicode
	// bidirectional overrides, which would let a branch name rewrite what
	// `kubectl get` and the plugin print. Git refuses the ASCII ones in ref
	// names too.
	BranchForbiddenChars = `\x{0000}-\x{001f}\x{007f}-\x{009f}\x{202a}-\x{202e}\x{2066}-\x{2069}`
	// BranchPattern is what spec.branch accepts.
	BranchPattern = `^[^` + BranchForbiddenChars + `]+$`
	// TimePattern is an RFC 3339 date-time with an upper-case T and Z and an
	// optional fraction of up to nine digits: what spec.timestamp and
	// spec.renewTime accept (the API server also checks that the date
	// exists).
	TimePattern = `^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$`
	// DurationPattern is a Go duration of at most four parts of at most five
	// digits each ("30m", "1h0m0s", "1.5h", "90s"): small enough that no
	// accepted value overflows a duration, so the bounds check always runs.
	DurationPattern = `^([0-9]{1,5}(\.[0-9]{1,9})?(ns|us|ms|s|m|h)){1,4}$`
)

// TargetField is the field selector of a BuildLock's spec.target, a
// selectable field of the CRD: a lock's claims are listed with it, from the
// API server and from the operator's cache, which indexes them under the same
// name.
const TargetField = "spec.target"

// Annotations the API defines.
const (
	// ForceReleaseAnnotation is the annotation that, set on a BuildLock to
	// "who: why", ends its hold (or its wait): the operator marks it
	// Released with reason ForceReleased and hands the lock on. The
	// annotation stays as the record of who did it.
	ForceReleaseAnnotation = "buildlock.io/force-release"
	// ForceReleasedByAnnotation names who set ForceReleaseAnnotation, as the
	// API server authenticated them: the buildlock-force-release admission
	// policies of enforcement stamp it on every request that sets, changes
	// or removes ForceReleaseAnnotation, and refuse any other change of it.
	// Without those policies anyone may write it, and the operator calls
	// the force-release unverified.
	ForceReleasedByAnnotation = "buildlock.io/force-released-by"
	// RunIDAnnotation identifies the pipeline run that created a BuildLock
	// (for example GitHub's run id and attempt, or a GitLab job id). A
	// client re-attaches to an existing claim only when it carries the
	// client's own run id (or names the client's own pod by UID); a re-run
	// of the same build number is another run, and never shares a claim.
	RunIDAnnotation = "buildlock.io/run-id"
	// MaxRunIDLength bounds RunIDAnnotation's value.
	MaxRunIDLength = 128
	// RunProofAnnotation is "sha256:<hex>", the SHA-256 of a secret that
	// only the job that created the BuildLock keeps (pkg/lock writes it to a
	// file in the job's own directory). A client re-attaches to a claim of
	// its run id only when it can show that secret, so that two jobs that
	// compute the same run id never share a claim. The claim being
	// readable, the secret itself is never on it.
	RunProofAnnotation = "buildlock.io/run-proof"
)

// EnforcementProbeUser is the user name the operator impersonates to probe
// an enforced lock's fence: a server-side dry-run create of a Lease in the
// target namespace, which the buildlock-enforce admission policy judges as
// a pipeline's that never holds. The operator's ClusterRole may impersonate
// this one user; its only right is to create Leases.
const EnforcementProbeUser = "buildlock:enforcement-probe"

// Bounds of free text that reaches a status message or an event.
const (
	// MaxForceReleaseReasonLength is the longest reason `kubectl buildlock
	// force-release --reason` accepts, in characters.
	MaxForceReleaseReasonLength = 256
	// MaxQuotedLength is the most characters of a free-text value (the
	// force-release annotation) that the operator quotes in a status
	// message or an event; a longer value is cut and marked with "…".
	// Control characters are escaped, never printed raw.
	MaxQuotedLength = 320
)

// Bounds and patterns of a BuildLockPolicy's spec.windows, as the CRD
// enforces them (CronSchedule, TimeZone and Window repeat them literally).
const (
	// MaxWindows bounds the number of a policy's windows.
	MaxWindows = 32
	// MinWindowDuration and MaxWindowDuration bound a recurring window's
	// duration.
	MinWindowDuration = time.Minute
	MaxWindowDuration = 366 * 24 * time.Hour
	// MaxScheduleLength bounds a window's schedule, in bytes.
	MaxScheduleLength = 100
	// MaxWindowReasonLength bounds a window's reason, in characters; the
	// reason of `kubectl buildlock freeze` and `override` too.
	MaxWindowReasonLength = 256
	// DefaultTimeZone is the time zone of a window without one.
	DefaultTimeZone = "UTC"
	// TimeZonePattern is the shape of an IANA time-zone name ("Local",
	// names under posix/ and right/ excepted): the API server then checks
	// that its zone database knows it.
	TimeZonePattern = `^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$`
	// ScheduleShapePattern is five fields separated by spaces.
	ScheduleShapePattern = `^\S+( +\S+){4}$`
)

// The patterns of a schedule's five fields, unanchored, in their order:
// each is *, a value, or a range of values, optionally with a step, or a
// comma-separated list of them. The API server also checks that every
// range goes upwards.
const (
	CronMinutePattern     = `(\*|([0-5]?[0-9])(-([0-5]?[0-9]))?)(/[1-9][0-9]?)?(,(\*|([0-5]?[0-9])(-([0-5]?[0-9]))?)(/[1-9][0-9]?)?)*`
	CronHourPattern       = `(\*|([01]?[0-9]|2[0-3])(-([01]?[0-9]|2[0-3]))?)(/[1-9][0-9]?)?(,(\*|([01]?[0-9]|2[0-3])(-([01]?[0-9]|2[0-3]))?)(/[1-9][0-9]?)?)*`
	CronDayOfMonthPattern = `(\*|(0?[1-9]|[12][0-9]|3[01])(-(0?[1-9]|[12][0-9]|3[01]))?)(/[1-9][0-9]?)?(,(\*|(0?[1-9]|[12][0-9]|3[01])(-(0?[1-9]|[12][0-9]|3[01]))?)(/[1-9][0-9]?)?)*`
	CronMonthPattern      = `(\*|(0?[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec))(-(0?[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)))?)(/[1-9][0-9]?)?(,(\*|(0?[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec))(-(0?[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)))?)(/[1-9][0-9]?)?)*`
	CronDayOfWeekPattern  = `(\*|([0-6]|(?i:sun|mon|tue|wed|thu|fri|sat))(-([0-6]|(?i:sun|mon|tue|wed|thu|fri|sat)))?)(/[1-9][0-9]?)?(,(\*|([0-6]|(?i:sun|mon|tue|wed|thu|fri|sat))(-([0-6]|(?i:sun|mon|tue|wed|thu|fri|sat)))?)(/[1-9][0-9]?)?)*`
)

// CronFieldPatterns are the patterns of a schedule's fields, in order, with
// the field's name.
var CronFieldPatterns = [5]struct{ Name, Pattern string }{
	{"minute", CronMinutePattern},
	{"hour", CronHourPattern},
	{"day of month", CronDayOfMonthPattern},
	{"month", CronMonthPattern},
	{"day of week", CronDayOfWeekPattern},
}

// Bounds of a person's freezes and overrides.
const (
	// DefaultOverrideFor is how long an override lasts unused when
	// `kubectl buildlock override` is given no --for.
	DefaultOverrideFor = 30 * time.Minute
	// MaxOverrideFor bounds how far ahead an override's expiry may be.
	MaxOverrideFor = 24 * time.Hour
)
