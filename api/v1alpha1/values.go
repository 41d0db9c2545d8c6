package v1alpha1

import (
	"fmt"
	"regexp"
	"time"
	"unicode/utf8"
)

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
// created more than the allowance after it. A few seconds covers clocks
// kept by NTP (a creationTimestamp has whole seconds, which takes up to one
// of them).
const MaxTimestampSkew = 5 * time.Second

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
	// spec.branch, spec.workflow and every other free text that names a
	// line or gives a person's reason refuse (TextForbiddenChars).
	BranchForbiddenChars = TextForbiddenChars
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
	// CIRunPattern is what spec.requester.run accepts (RunExtra's value, as
	// an authenticator maps it: "5005/1", "12345"), so that a grant Lease's
	// annotations stay plain text.
	CIRunPattern = `^[A-Za-z0-9._/:-]+$`
	// MaxCIRunLength bounds spec.requester.run.
	MaxCIRunLength = 128
)

// TextForbiddenChars is the character class (without brackets, RE2 as Go
// and the API server's CEL read it) that free text naming a line or a
// person's reason refuses: control characters (Cc: newlines, tabs, escape
// sequences); invisible formatting characters (Cf: zero-width spaces and
// joiners, U+FEFF, the bidirectional marks U+200E, U+200F and U+061C, and
// the embeddings, overrides and isolates); line and paragraph separators
// (Zl, Zp); and the letters that render as nothing (U+034F, U+115F,
// U+1160, U+17B4, U+17B5, U+3164, U+FFA0). Each would let two names that
// read the same be two lines, or a text rewrite what kubectl and the
// plugin print: "ma\u200bin" is not "main".
const TextForbiddenChars = `\p{Cc}\p{Cf}\p{Zl}\p{Zp}\x{034F}\x{115F}\x{1160}\x{17B4}\x{17B5}\x{3164}\x{FFA0}`

// TextRule is the CEL rule of every such field of the CRDs (their markers
// repeat it literally; a test keeps them equal): it refuses
// TextForbiddenChars.
const TextRule = `!self.matches(r'[` + TextForbiddenChars + `]')`

// TextMessageExpression is the CEL messageExpression that goes with
// TextRule on field (for example "spec.branch"): it names the first
// refused character by its code point and says where it is, as TextError
// does. CEL has no way to name a code point but its UTF-8 bytes, which
// the expression decodes.
func TextMessageExpression(field string) string {
	return textMessageExpression("self", field)
}

// TextAnnotations are the annotations of a BuildLock that carry a person's
// or a pipeline's text: the buildlock-text admission policy refuses
// TextForbiddenChars in them (config/identity/text.yaml).
var TextAnnotations = []string{ForceReleaseAnnotation, OverrideAnnotation, RunIDAnnotation}

// TextAnnotationRule and TextAnnotationMessageExpression are the
// validation of the buildlock-text admission policy for annotation key, as
// TextRule and TextMessageExpression are for a field (its variable
// annotations is the object's annotations, or none).
func TextAnnotationRule(key string) string {
	return `!('` + key + `' in variables.annotations) || !variables.annotations['` + key + `'].matches(r'[` + TextForbiddenChars + `]')`
}

// TextAnnotationMessageExpression is the message of TextAnnotationRule(key).
func TextAnnotationMessageExpression(key string) string {
	return textMessageExpression(`variables.annotations['`+key+`']`, "annotation "+key)
}

// textMessageExpression is TextMessageExpression for the string subject.
func textMessageExpression(subject, field string) string {
	// (charAt and string() of a number would make the cost estimate
	// unbounded; indexing a list of literals does not.)
	digit := func(n string) string {
		return `['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][` + n + ` % 16]`
	}
	return `[` + subject + `.find(r'[` + TextForbiddenChars + `]')].map(c, [string(` + subject + `.indexOf(c) + 1)].map(i, ` +
		`['%x'.format([bytes(c)])].map(h, [[0, 1, 2, 3].filter(k, 2 * k < size(h)).map(k, ` +
		`'0123456789abcdef'.indexOf(h.charAt(2 * k)) * 16 + '0123456789abcdef'.indexOf(h.charAt(2 * k + 1)))].map(b, ` +
		`[size(b) == 1 ? b[0] : size(b) == 2 ? (b[0] - 192) * 64 + b[1] - 128 : size(b) == 3 ? ` +
		`(b[0] - 224) * 4096 + (b[1] - 128) * 64 + b[2] - 128 : ` +
		`(b[0] - 240) * 262144 + (b[1] - 128) * 4096 + (b[2] - 128) * 64 + b[3] - 128].map(p, '` + field + ` must not ` +
		`contain invisible, bidirectional or control characters: it has U+' + ` +
		`(p >= 1048576 ? ` + digit("p / 1048576") + ` : '') + (p >= 65536 ? ` + digit("p / 65536") + ` : '') + ` +
		digit("p / 4096") + ` + ` + digit("p / 256") + ` + ` + digit("p / 16") + ` + ` + digit("p") + ` + ` +
		`' at character ' + i + '; write it without that character')[0])[0])[0])[0])[0]`
}

// TextMessage is the fallback message of TextRule on field, for an API
// server that cannot evaluate TextMessageExpression.
func TextMessage(field string) string {
	return field + " must not contain invisible, bidirectional or control characters (zero-width spaces, " +
		"bidirectional marks and overrides, line separators, newlines, tabs)"
}

// textForbidden matches one character of TextForbiddenChars.
var textForbidden = regexp.MustCompile(`[` + TextForbiddenChars + `]`)

// TextError returns the error the API server gives for field's value s
// (see TextRule and TextMessageExpression), or nil when s has no refused
// character: clients (the plugin) refuse such text with the same words.
func TextError(field, s string) error {
	loc := textForbidden.FindStringIndex(s)
	if loc == nil {
		return nil
	}
	r, _ := utf8.DecodeRuneInString(s[loc[0]:])
	return fmt.Errorf("%s must not contain invisible, bidirectional or control characters: it has U+%04X at character %d; "+
		"write it without that character", field, r, utf8.RuneCountInString(s[:loc[0]])+1)
}

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

// RepositoryExtra is the key of the user extra that makes an authenticated
// identity a CI identity: the API server's authenticator (an
// AuthenticationConfiguration's claimMappings.extra, for the OIDC tokens of
// GitHub Actions or GitLab CI) maps the token's repository into it. Such an
// identity is a pipeline, like a service account: it may claim only for
// that repository (spec.repo), an enforced lock fences its writes, it owns
// the lines it holds, and consent and force-release are not its to give.
// Nobody but the authenticator (or whoever may impersonate the extra) can
// set it.
const RepositoryExtra = "buildlock.io/repository"

// WorkflowExtra is the key of the user extra that names a CI identity's
// workflow: the authenticator maps it from the token (GitHub's
// workflow_ref without its @ref, the file that numbers GITHUB_RUN_NUMBER).
// The requester policy stamps it into spec.requester.workflow, and the
// claim-identity policy refuses a claim of such an identity whose
// spec.workflow is another: a workflow the API server verified (see
// docs/api.md, "Lines and identities"). A claim's workflow that nothing
// verified is free text, and judged by its branch's line without one too.
const WorkflowExtra = "buildlock.io/workflow"

// RunExtra is the key of the user extra that names a CI identity's run:
// the authenticator maps it from the token (GitHub's run_id and
// run_attempt, GitLab's job_id). A claim's requester records it
// (spec.requester.run), and an enforced lock that a CI identity's claim
// holds admits the writes of that run only, not of the repository's other
// runs.
const RunExtra = "buildlock.io/run"

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

// Defaults of a BuildLockPolicy's re-run and rollback settings, for a lock
// without a policy, or a policy that leaves them out.
const (
	DefaultReruns    = RerunsAllowed
	DefaultRollbacks = RollbacksAnyone
)

// Bounds of the fields that name a workflow and a rollback's reason.
const (
	MaxWorkflowLength = 255
	// MaxRollbackReasonLength bounds spec.rollback.reason, in characters.
	MaxRollbackReasonLength = 256
)

// AuditAnnotation on a grant Lease is its audit of the lock's notable
// events (JSON, newest last): force-releases, rollbacks and overrides,
// with who and why, bounded to MaxAuditEntries. It outlives the claims.
const AuditAnnotation = "buildlock.io/audit"

// MaxAuditEntries bounds the grant record's audit: the oldest entries go.
const MaxAuditEntries = 10

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
