package lock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// Released is a claim that a release deleted, as it was read before; Gone
// says it was already gone when the release came to delete it.
type Released struct {
	BuildLock *buildlockv1.BuildLock
	Gone      bool
}

// ReleaseName deletes the BuildLock name in namespace (if it is still the
// object read: the delete is guarded by its UID). It returns nil when there
// is no such BuildLock. c needs get and delete on buildlocks.
func ReleaseName(ctx context.Context, c client.Client, namespace, name string) (*Released, error) {
	bl := &buildlockv1.BuildLock{}
	err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, bl)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading BuildLock %s/%s: %w", namespace, name, err)
	}
	gone, err := deleteClaim(ctx, c, bl, false)
	if err != nil {
		return nil, err
	}
	return &Released{BuildLock: bl, Gone: gone}, nil
}

// BuildRef names one build's claims on one target.
type BuildRef struct {
	Namespace, Target string
	Repo, Branch      string
	// Workflow is the build's spec.workflow (empty for claims without one).
	Workflow string
	Build    int64
	// RunID, when set, narrows the claims to those of this run (their
	// buildlockv1.RunIDAnnotation) that this job can prove it made: they
	// name its pod by UID (PodUID), or its proof in StateDir proves them
	// (see Claim.StateDir). Empty means every run's claims of the build.
	RunID    string
	PodUID   string
	StateDir string
}

// ReleaseBuild deletes b's claims, each guarded by the UID read, and the
// proofs of those it proved. Claims of the same build made by other runs
// than b.RunID, or carrying b.RunID without proof that this job made them,
// are left alone and returned in others. c needs list and delete on
// buildlocks.
func ReleaseBuild(ctx context.Context, c client.Client, b BuildRef) (released []Released, others []buildlockv1.BuildLock, err error) {
	claims, err := listClaims(ctx, c, b.Namespace, b.Target)
	if err != nil {
		return nil, nil, err
	}
	var p *proof
	if b.RunID != "" && b.StateDir != "" {
		p = &proof{path: proofPath(b.StateDir, Claim{Namespace: b.Namespace, Target: b.Target, Repo: b.Repo, Branch: b.Branch, Build: b.Build, RunID: b.RunID})}
		p.state, _ = readProof(p.path) // none: a proof of nothing
	}
	mine := func(bl *buildlockv1.BuildLock) bool {
		switch {
		case b.RunID == "":
			return true
		case RunIDOf(bl) != b.RunID:
			return false
		case Claim{PodUID: b.PodUID}.ownsByPod(bl):
			return true
		}
		return p != nil && p.proves(bl)
	}
	var errs []error
	for i := range claims {
		bl := &claims[i]
		switch {
		case bl.Spec.Repo != b.Repo || bl.Spec.Branch != b.Branch || bl.Spec.Workflow != b.Workflow || bl.Spec.Build != b.Build:
			continue
		case !mine(bl):
			others = append(others, *bl)
			continue
		}
		gone, err := deleteClaim(ctx, c, bl, false)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if p != nil && p.proves(bl) {
			p.remove()
		}
		released = append(released, Released{BuildLock: bl, Gone: gone})
	}
	return released, others, errors.Join(errs...)
}

// ForceReleased is what ForceRelease did.
type ForceReleased struct {
	// Holder is the claim that held the target, as read before it was
	// annotated.
	Holder *buildlockv1.BuildLock
	// Value is the buildlockv1.ForceReleaseAnnotation written: "who: why".
	Value string
	// Event is the Warning event recorded on the holder, and EventErr why it
	// could not be (the annotation is what the operator acts on; the event
	// is the record).
	Event    *corev1.Event
	EventErr error
}

// EventReasonForceRelease is the reason of the event ForceRelease records.
const EventReasonForceRelease = "ForceRelease"

// ValidateReason checks a force-release reason: not blank, at most
// buildlockv1.MaxForceReleaseReasonLength characters, no control
// characters. The error wraps ErrInvalidReason.
func ValidateReason(reason string) error {
	if err := validateText(reason, buildlockv1.MaxForceReleaseReasonLength); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidReason, err)
	}
	return nil
}

// validateText checks free text that people read in messages and audits
// (a force-release's or a rollback's reason): not blank, at most limit
// characters, no control characters.
func validateText(text string, limit int) error {
	switch n := utf8.RuneCountInString(text); {
	case strings.TrimSpace(text) == "":
		return errors.New("say why")
	case n > limit:
		return fmt.Errorf("%d characters, more than the %d allowed", n, limit)
	case buildlockv1.TextError("it", text) != nil:
		return buildlockv1.TextError("it", text) // the API server's words
	}
	return nil
}

// ForceRelease asks the operator to end the hold of target in namespace:
// it annotates the holder (see holderOf) with
// buildlockv1.ForceReleaseAnnotation "<who>: <reason>", who being the
// caller as the API server knows it, with a patch guarded by the holder's
// UID, and records a Warning event on it. The operator then releases the
// hold (reason ForceReleased) and grants the lock on. Without a holder it
// fails with ErrNoHolder.
//
// c needs list and patch on buildlocks, and create on events.
func ForceRelease(ctx context.Context, c client.Client, namespace, target, reason string) (*ForceReleased, error) {
	if err := ValidateReason(reason); err != nil {
		return nil, err
	}
	claims, err := listClaims(ctx, c, namespace, target)
	if err != nil {
		return nil, err
	}
	ptrs := make([]*buildlockv1.BuildLock, len(claims))
	for i := range claims {
		ptrs[i] = &claims[i]
	}
	holder := holderOf(ptrs)
	if holder == nil {
		return nil, fmt.Errorf("%w: no claim holds %s in namespace %s", ErrNoHolder, target, namespace)
	}
	who := cmp.Or(whoAmI(ctx, c), "unknown")
	r := &ForceReleased{Holder: holder, Value: who + ": " + reason}
	err = patchClaim(ctx, c, holder, map[string]any{
		"metadata": map[string]any{"annotations": map[string]string{buildlockv1.ForceReleaseAnnotation: r.Value}},
	})
	if err != nil {
		return nil, err
	}
	r.Event = forceReleaseEvent(holder, who, reason, time.Now())
	if err := c.Create(ctx, r.Event); err != nil {
		r.Event, r.EventErr = nil, fmt.Errorf("recording the event: %w", err)
	}
	return r, nil
}

// whoAmI asks the API server who the caller is (a SelfSubjectReview): its
// user name, "" when it cannot tell.
func whoAmI(ctx context.Context, c client.Client) string {
	review := &authenticationv1.SelfSubjectReview{}
	if err := c.Create(ctx, review); err != nil {
		return ""
	}
	return review.Status.UserInfo.Username
}

// forceReleaseEvent is the record of a force-release on the holder.
func forceReleaseEvent(bl *buildlockv1.BuildLock, who, reason string, now time.Time) *corev1.Event {
	t := metav1.NewTime(now)
	suffix := fmt.Sprintf(".%x", now.UnixNano())
	prefix := strings.TrimRight(bl.Name[:min(len(bl.Name), validation.DNS1123SubdomainMaxLength-len(suffix))], "-.")
	return &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: bl.Namespace, Name: prefix + suffix},
		InvolvedObject: corev1.ObjectReference{
			APIVersion: buildlockv1.GroupVersion.String(), Kind: "BuildLock",
			Namespace: bl.Namespace, Name: bl.Name, UID: bl.UID, ResourceVersion: bl.ResourceVersion,
		},
		Reason:              EventReasonForceRelease,
		Message:             fmt.Sprintf("%s asked to end the hold of %s (token %d): %s", who, Describe(bl), bl.Status.FencingToken, reason),
		Type:                corev1.EventTypeWarning,
		Source:              corev1.EventSource{Component: "kubectl-buildlock"},
		FirstTimestamp:      t,
		LastTimestamp:       t,
		Count:               1,
		ReportingController: "buildlock.io/kubectl-buildlock",
	}
}
