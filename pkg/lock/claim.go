package lock

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// ForceReleaseAnnotation on a BuildLock asks the operator to end its hold
// (or its wait); the value records who and why. It is the API's
// v1alpha1.ForceReleaseAnnotation.
const ForceReleaseAnnotation = buildlockv1.ForceReleaseAnnotation

// MaxNameLength bounds derived names. It is a DNS label's length, stricter
// than the 253 characters a BuildLock name may have, so that a name fits in a
// label value and stays readable in `kubectl get` tables.
const MaxNameLength = validation.DNS1123LabelMaxLength

// Bounds of spec.expiresAfter, as the CRD enforces them.
const (
	MinExpiresAfter = 10 * time.Second
	MaxExpiresAfter = 24 * time.Hour
)

// Claim is one build's claim on one deploy target: the spec of the BuildLock
// that Acquire creates.
type Claim struct {
	// Namespace is where the BuildLock is created: the pipeline's namespace.
	Namespace string
	// Target is the namespace the build deploys into.
	Target string
	// Repo (owner/name), Branch and Build identify the build; a higher Build
	// of the same Repo and Branch is newer.
	Repo   string
	Branch string
	Build  int64
	// PodName (and optionally PodUID) name the pipeline's pod in Namespace.
	// While it runs the build is alive. Empty for a pod-less claim, which
	// Acquire keeps alive by renewing it.
	PodName string
	PodUID  string
	// Timestamp is when the build started; zero lets the BuildLock's
	// creation time stand in.
	Timestamp time.Time
	// ExpiresAfter bounds a pod-less hold between renewals; zero takes the
	// API's default (1h).
	ExpiresAfter time.Duration
	// Name overrides the derived BuildLock name.
	Name string
}

var (
	// repoPattern is the CRD's pattern for spec.repo.
	repoPattern = regexp.MustCompile(`^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+$`)
	// podUIDPattern is the CRD's pattern for spec.podRef.uid.
	podUIDPattern = regexp.MustCompile(`^[0-9a-fA-F-]+$`)
)

// Validate checks the claim as the API server would, so that a bad flag is
// reported before anything is created. The error wraps ErrInvalidClaim and
// names every field that is wrong.
func (c Claim) Validate() error {
	errs := slices.Concat(c.validatePlace(), c.validateBuild(), c.validatePod())
	if c.ExpiresAfter != 0 && (c.ExpiresAfter < MinExpiresAfter || c.ExpiresAfter > MaxExpiresAfter) {
		errs = append(errs, fmt.Errorf("expires-after %s must be between %s and %s", c.ExpiresAfter, MinExpiresAfter, MaxExpiresAfter))
	}
	if c.Name != "" {
		if msgs := validation.IsDNS1123Subdomain(c.Name); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("name %q: %s", c.Name, strings.Join(msgs, "; ")))
		}
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
	if c.Target == "" {
		errs = append(errs, errors.New("target must not be empty: name the namespace the build deploys into"))
	} else if msgs := validation.IsDNS1123Label(c.Target); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("target %q must be a namespace name: %s", c.Target, strings.Join(msgs, "; ")))
	}
	return errs
}

// validateBuild checks repo, branch and build.
func (c Claim) validateBuild() []error {
	var errs []error
	switch {
	case c.Repo == "":
		errs = append(errs, errors.New("repo must not be empty: give it as owner/name"))
	case len(c.Repo) > 255 || !repoPattern.MatchString(c.Repo):
		errs = append(errs, fmt.Errorf("repo %q must be owner/name (letters, digits, '_', '.', '-'; at most 255 characters)", c.Repo))
	}
	switch {
	case c.Branch == "":
		errs = append(errs, errors.New("branch must not be empty"))
	case len(c.Branch) > 255:
		errs = append(errs, fmt.Errorf("branch must be at most 255 characters, not %d", len(c.Branch)))
	}
	if c.Build < 1 {
		errs = append(errs, fmt.Errorf("build must be a build number of at least 1, not %d", c.Build))
	}
	return errs
}

// validatePod checks the pod's name and UID.
func (c Claim) validatePod() []error {
	var errs []error
	if c.PodName != "" {
		if msgs := validation.IsDNS1123Subdomain(c.PodName); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("pod %q must be a pod name: %s", c.PodName, strings.Join(msgs, "; ")))
		}
	}
	switch {
	case c.PodUID == "":
	case c.PodName == "":
		errs = append(errs, fmt.Errorf("pod UID %q needs a pod name", c.PodUID))
	case len(c.PodUID) > 36 || !podUIDPattern.MatchString(c.PodUID):
		errs = append(errs, fmt.Errorf("pod UID %q must be a UID (hex digits and '-', at most 36)", c.PodUID))
	}
	return errs
}

// Name returns the BuildLock name of the claim: Claim.Name when set, else
// derived from the claim's identity as <repo>-<branch>-<build>-<target>,
// lower-cased, with every run of other characters than a-z and 0-9 turned
// into one '-'. The target is part of the name because one build may claim
// several targets (staging, then production) in one namespace. A name that
// would be longer than MaxNameLength keeps its build and target, shortens
// repo and branch, and ends in 8 hex digits of a hash of the identity, so
// that it stays unique: build 4711 of acme/frontend-monorepo on branch
// feature/payments-v2-with-a-very-long-name claiming staging is
// "acme-frontend-monorepo-feature-payments-v-4711-staging-dd60ef1d".
// The result is always a valid DNS label.
func Name(c Claim) string {
	if c.Name != "" {
		return c.Name
	}
	full := joinParts(sanitize(c.Repo), sanitize(c.Branch), buildPart(c.Build), sanitize(c.Target))
	if full != "" && len(full) <= MaxNameLength {
		return full
	}
	return compactName(c, identityHash(c.Target, c.Repo, c.Branch, strconv.FormatInt(c.Build, 10)))
}

// fallbackName is the name Acquire uses when Name(c) is taken by a claim
// with another spec (two identities that sanitize alike, or a retried
// build with another pod): the compact form with a hash of the whole spec.
func fallbackName(c Claim) string {
	return compactName(c, identityHash(c.Target, c.Repo, c.Branch, strconv.FormatInt(c.Build, 10),
		c.PodName, c.PodUID, c.Timestamp.UTC().Format(time.RFC3339Nano), c.ExpiresAfter.String()))
}

// compactName is <repo-branch, shortened>-<build>-<target, shortened>-<hash>,
// at most MaxNameLength long.
func compactName(c Claim, hash string) string {
	const maxTail = 30 // build (up to 19 digits) and target
	tail := joinParts(buildPart(c.Build), sanitize(c.Target))
	if len(tail) > maxTail {
		tail = strings.TrimRight(tail[:maxTail], "-")
	}
	headBudget := MaxNameLength - len(hash) - 1
	if tail != "" {
		headBudget -= len(tail) + 1
	}
	head := joinParts(sanitize(c.Repo), sanitize(c.Branch))
	if len(head) > headBudget {
		head = strings.TrimRight(head[:headBudget], "-")
	}
	if head == "" && tail == "" {
		head = "buildlock"
	}
	return joinParts(head, tail, hash)
}

// sanitize lower-cases s and turns every run of characters other than a-z
// and 0-9 into one '-', trimmed at both ends.
func sanitize(s string) string {
	return collapseRuns(strings.ToLower(s), func(r rune) bool {
		return ('a' <= r && r <= 'z') || ('0' <= r && r <= '9')
	})
}

// collapseRuns keeps the runes of s that keep accepts and turns every run of
// the others into one '-', never at the start or the end.
func collapseRuns(s string, keep func(rune) bool) string {
	var b strings.Builder
	dash := false
	for _, r := range s {
		if !keep(r) {
			dash = true
			continue
		}
		if dash && b.Len() > 0 {
			b.WriteByte('-')
		}
		dash = false
		b.WriteRune(r)
	}
	return b.String()
}

func buildPart(build int64) string {
	if build < 1 {
		return ""
	}
	return strconv.FormatInt(build, 10)
}

// joinParts joins the non-empty parts with '-'.
func joinParts(parts ...string) string {
	kept := parts[:0:0]
	for _, p := range parts {
		if p != "" {
			kept = append(kept, p)
		}
	}
	return strings.Join(kept, "-")
}

// identityHash is 8 hex digits of a SHA-256 over the fields, each ended by
// a NUL so that ("ab", "c") and ("a", "bc") differ.
func identityHash(fields ...string) string {
	h := sha256.New()
	for _, f := range fields {
		h.Write([]byte(f))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:8]
}

// BuildLock returns the BuildLock that claims c, named Name(c).
func (c Claim) BuildLock() *buildlockv1.BuildLock {
	bl := &buildlockv1.BuildLock{
		TypeMeta:   metav1.TypeMeta{APIVersion: buildlockv1.GroupVersion.String(), Kind: "BuildLock"},
		ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: Name(c)},
		Spec: buildlockv1.BuildLockSpec{
			Target: c.Target,
			Repo:   c.Repo,
			Branch: c.Branch,
			Build:  c.Build,
		},
	}
	if c.PodName != "" {
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

// sameClaim reports whether the existing BuildLock is the one c would
// create, so that a retried step attaches to it: the same target, repo,
// branch, build and pod, and the same timestamp and expiresAfter where c
// sets them (the API server defaults expiresAfter).
func sameClaim(existing *buildlockv1.BuildLock, c Claim) bool {
	s := existing.Spec
	if s.Target != c.Target || s.Repo != c.Repo || s.Branch != c.Branch || s.Build != c.Build {
		return false
	}
	switch {
	case c.PodName == "" && s.PodRef != nil, c.PodName != "" && s.PodRef == nil:
		return false
	case c.PodName != "" && (s.PodRef.Name != c.PodName || (c.PodUID != "" && types.UID(s.PodRef.UID) != types.UID(c.PodUID))):
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
