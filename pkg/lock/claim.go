package lock

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// Claim is one build's claim on one deploy target: the spec of the BuildLock
// that Acquire creates.
type Claim struct {
	// Namespace is where the BuildLock is created: the pipeline's namespace.
	Namespace string
	// Target is the namespace the build deploys into.
	Target string
	// Repo (owner/name), Branch and Build identify the build; a higher Build
	// of the same Repo, Branch and Workflow is newer.
	Repo   string
	Branch string
	Build  int64
	// Workflow is what the CI system numbers builds in, when that is less
	// than the repository (spec.workflow): a GitHub workflow, a Jenkins job,
	// a Tekton pipeline. Builds of two workflows are never compared. Empty:
	// the line is Repo and Branch alone.
	Workflow string
	// Rollback, when set, makes the claim a rollback on purpose
	// (spec.rollback): it may deploy a build at or below one of its line
	// that already deployed, if the target's policy allows it.
	Rollback *buildlockv1.Rollback
	// PodName (and optionally PodUID) name the pipeline's pod in Namespace.
	// While it runs the build is alive. Empty for a pod-less claim, which
	// Acquire keeps alive by renewing it.
	PodName string
	PodUID  string
	// Timestamp is when the build started; zero lets the BuildLock's
	// creation time stand in.
	Timestamp time.Time
	// ExpiresAfter bounds a pod-less hold between renewals; zero means the
	// API's buildlockv1.DefaultExpiresAfter. A claim with a pod has none.
	ExpiresAfter time.Duration
	// Name overrides the derived BuildLock name.
	Name string
	// RunID identifies this job of this run of the build (a re-run of a CI
	// job keeps the build number but is another run; two jobs of one CI run
	// are two runs). It is written to the BuildLock's
	// buildlockv1.RunIDAnnotation. Empty: Acquire draws a random one, so
	// that the claim is never shared.
	RunID string
	// StateDir is a directory of this job's own (the CI runner's temp
	// directory, say) where Acquire keeps the proof that this job created
	// its claim: a secret whose hash the claim carries
	// (buildlockv1.RunProofAnnotation). Acquire re-attaches to an existing
	// claim only when it names this run's pod by UID, or when the proof in
	// StateDir shows that this job made it and the process that did has
	// ended without handing it over (Hold.Detach): a retried step after the
	// plugin died. Empty: the proof is kept in memory only, and a claim is
	// never re-attached to after this process ends. StateDir is not part of
	// the BuildLock.
	StateDir string
}

// The API's patterns, compiled once (Go's regexp and the API server accept
// the same strings for them).
var (
	targetPattern  = regexp.MustCompile(buildlockv1.TargetPattern)
	repoPattern    = regexp.MustCompile(buildlockv1.RepoPattern)
	branchPattern  = regexp.MustCompile(buildlockv1.BranchPattern)
	podNamePattern = regexp.MustCompile(buildlockv1.PodNamePattern)
	podUIDPattern  = regexp.MustCompile(buildlockv1.PodUIDPattern)
)

// Validate checks the claim as the API server would (with the API's
// bounds and patterns, lengths counted in characters as the API server
// counts them), so that a bad flag is reported before anything is created.
// The error wraps ErrInvalidClaim and names every field that is wrong.
func (c Claim) Validate() error {
	errs := slices.Concat(c.validatePlace(), c.validateBuild(), c.validatePod(), c.validateTimes())
	if c.Name != "" {
		if msgs := validation.IsDNS1123Subdomain(c.Name); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("name %q: %s", c.Name, strings.Join(msgs, "; ")))
		}
	}
	if err := validateRunID(c.RunID); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalidClaim, errors.Join(errs...))
}

// validatePlace checks the namespace and the target.
func (c Claim) validatePlace() []error {
	var errs []error
	if c.Namespace == "" {
		errs = append(errs, errors.New("namespace must not be empty"))
	} else if msgs := validation.IsDNS1123Label(c.Namespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("namespace %q: %s", c.Namespace, strings.Join(msgs, "; ")))
	}
	switch {
	case c.Target == "":
		errs = append(errs, errors.New("target must not be empty: name the namespace the build deploys into"))
	case len(c.Target) > buildlockv1.MaxTargetLength || !targetPattern.MatchString(c.Target):
		errs = append(errs, fmt.Errorf("target %q must be a namespace name (lower-case letters, digits and '-', at most %d characters)",
			c.Target, buildlockv1.MaxTargetLength))
	}
	return errs
}

// validateBuild checks repo, branch and build.
func (c Claim) validateBuild() []error {
	var errs []error
	switch n := utf8.RuneCountInString(c.Repo); {
	case c.Repo == "":
		errs = append(errs, errors.New("repo must not be empty: give it as owner/name"))
	case n < buildlockv1.MinRepoLength || n > buildlockv1.MaxRepoLength || !repoPattern.MatchString(c.Repo):
		errs = append(errs, fmt.Errorf("repo %q must be owner/name (letters, digits, '_', '.', '-'; %d to %d characters)",
			c.Repo, buildlockv1.MinRepoLength, buildlockv1.MaxRepoLength))
	}
	switch n := utf8.RuneCountInString(c.Branch); {
	case c.Branch == "":
		errs = append(errs, errors.New("branch must not be empty"))
	case n > buildlockv1.MaxBranchLength:
		errs = append(errs, fmt.Errorf("branch must be at most %d characters, not %d", buildlockv1.MaxBranchLength, n))
	case buildlockv1.TextError("spec.branch", c.Branch) != nil:
		errs = append(errs, buildlockv1.TextError("spec.branch", c.Branch)) // the API server's words
	}
	if c.Build < 1 || c.Build > buildlockv1.MaxBuild {
		errs = append(errs, fmt.Errorf("build must be a build number from 1 to %d, not %d", int64(buildlockv1.MaxBuild), c.Build))
	}
	switch n := utf8.RuneCountInString(c.Workflow); {
	case n > buildlockv1.MaxWorkflowLength:
		errs = append(errs, fmt.Errorf("workflow must be at most %d characters, not %d", buildlockv1.MaxWorkflowLength, n))
	case buildlockv1.TextError("spec.workflow", c.Workflow) != nil:
		errs = append(errs, buildlockv1.TextError("spec.workflow", c.Workflow))
	}
	if c.Rollback != nil {
		if err := validateText(c.Rollback.Reason, buildlockv1.MaxRollbackReasonLength); err != nil {
			errs = append(errs, fmt.Errorf("rollback reason: %w", err))
		}
	}
	return errs
}

// validatePod checks the pod's name and UID.
func (c Claim) validatePod() []error {
	var errs []error
	if c.PodName != "" && (len(c.PodName) > buildlockv1.MaxPodNameLength || !podNamePattern.MatchString(c.PodName)) {
		errs = append(errs, fmt.Errorf("pod %q must be a pod name (a DNS-1123 subdomain of at most %d characters)",
			c.PodName, buildlockv1.MaxPodNameLength))
	}
	switch {
	case c.PodUID == "":
	case c.PodName == "":
		errs = append(errs, fmt.Errorf("pod UID %q needs a pod name", c.PodUID))
	case len(c.PodUID) > buildlockv1.MaxPodUIDLength || !podUIDPattern.MatchString(c.PodUID):
		errs = append(errs, fmt.Errorf("pod UID %q must be a UID such as 6f1c7a2e-5b1d-4c6e-9a0b-2f9d3c4e5a6b", c.PodUID))
	}
	return errs
}

// validateTimes checks the timestamp and expiresAfter.
func (c Claim) validateTimes() []error {
	var errs []error
	// The API accepts RFC 3339 times, which have four-digit years.
	if y := c.Timestamp.UTC().Year(); !c.Timestamp.IsZero() && (y < 1 || y > 9999) {
		errs = append(errs, fmt.Errorf("timestamp %s must be between the years 1 and 9999", c.Timestamp))
	}
	switch {
	case c.ExpiresAfter == 0:
	case c.PodName != "":
		errs = append(errs, errors.New("expires-after applies only to a claim without a pod: a claim with a pod holds while its pod runs"))
	case c.ExpiresAfter < buildlockv1.MinExpiresAfter || c.ExpiresAfter > buildlockv1.MaxExpiresAfter:
		errs = append(errs, fmt.Errorf("expires-after %s must be between %s and %s",
			c.ExpiresAfter, buildlockv1.MinExpiresAfter, buildlockv1.MaxExpiresAfter))
	}
	return errs
}

// validateRunID checks a run id: at most buildlockv1.MaxRunIDLength
// characters, none of them control characters.
func validateRunID(id string) error {
	if n := utf8.RuneCountInString(id); n > buildlockv1.MaxRunIDLength || (id != "" && !branchPattern.MatchString(id)) {
		return fmt.Errorf("run id %q must be at most %d characters, without control characters", id, buildlockv1.MaxRunIDLength)
	}
	return nil
}

// BuildLock returns the BuildLock that claims c, named Name(c), with c's
// run id in its buildlockv1.RunIDAnnotation.
func (c Claim) BuildLock() *buildlockv1.BuildLock {
	bl := &buildlockv1.BuildLock{
		TypeMeta:   metav1.TypeMeta{APIVersion: buildlockv1.GroupVersion.String(), Kind: "BuildLock"},
		ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: Name(c)},
		Spec: buildlockv1.BuildLockSpec{
			Target:   c.Target,
			Repo:     c.Repo,
			Branch:   c.Branch,
			Workflow: c.Workflow,
			Build:    c.Build,
		},
	}
	if c.Rollback != nil {
		bl.Spec.Rollback = &buildlockv1.Rollback{Reason: c.Rollback.Reason}
	}
	if c.RunID != "" {
		bl.Annotations = map[string]string{buildlockv1.RunIDAnnotation: c.RunID}
	}
	if c.PodName != "" || c.PodUID != "" {
		bl.Spec.PodRef = &buildlockv1.PodReference{Name: c.PodName, UID: c.PodUID}
	}
	if !c.Timestamp.IsZero() {
		bl.Spec.Timestamp = buildlockv1.NewTimestamp(c.Timestamp)
	}
	if c.ExpiresAfter != 0 {
		bl.Spec.ExpiresAfter = &metav1.Duration{Duration: c.ExpiresAfter}
	}
	return bl
}

// sameClaim reports whether the existing BuildLock claims what c claims: the
// same target, repo, branch, workflow, build, rollback and pod, and the
// same timestamp and expiresAfter where c sets them. It says nothing about
// whose claim it is (see owns).
func sameClaim(existing *buildlockv1.BuildLock, c Claim) bool {
	s := existing.Spec
	if !sameBuild(s, c) {
		return false
	}
	switch {
	case c.PodName == "" && s.PodRef != nil, c.PodName != "" && s.PodRef == nil:
		return false
	case c.PodName != "" && (s.PodRef.Name != c.PodName || (c.PodUID != "" && s.PodRef.UID != c.PodUID)):
		return false
	}
	if !c.Timestamp.IsZero() && (s.Timestamp == nil || !s.Timestamp.Truncate(time.Microsecond).Equal(c.Timestamp.Truncate(time.Microsecond))) {
		return false
	}
	if c.ExpiresAfter != 0 && (s.ExpiresAfter == nil || s.ExpiresAfter.Duration != c.ExpiresAfter) {
		return false
	}
	return true
}

// sameBuild reports whether spec s claims c's target for c's build: the
// same repo, branch, workflow and build, and the same rollback, if any.
func sameBuild(s buildlockv1.BuildLockSpec, c Claim) bool {
	return s.Target == c.Target && s.Repo == c.Repo && s.Branch == c.Branch && s.Workflow == c.Workflow && s.Build == c.Build &&
		(s.Rollback == nil) == (c.Rollback == nil) && (s.Rollback == nil || *s.Rollback == *c.Rollback)
}

// ownsByPod reports whether the existing BuildLock names this run's pod by
// UID: the pod is the job, whichever process of it created the claim.
func (c Claim) ownsByPod(existing *buildlockv1.BuildLock) bool {
	p := existing.Spec.PodRef
	return c.PodUID != "" && p != nil && p.UID == c.PodUID
}

// Describe names bl's build and target, for messages: "build 42 of
// acme/shop@main on staging", with " (workflow W)" after the branch for a
// claim of a workflow, and ", a rollback" for a rollback.
func Describe(bl *buildlockv1.BuildLock) string {
	s := fmt.Sprintf("build %d of %s@%s", bl.Spec.Build, bl.Spec.Repo, bl.Spec.Branch)
	if w := bl.Spec.Workflow; w != "" {
		s += " (workflow " + w + ")"
	}
	s += " on " + bl.Spec.Target
	if bl.Spec.Rollback != nil {
		s += ", a rollback"
	}
	return s
}

// RunIDOf returns the run id a BuildLock carries, "" if none.
func RunIDOf(bl *buildlockv1.BuildLock) string {
	return bl.Annotations[buildlockv1.RunIDAnnotation]
}
