package lock

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// ErrNotFrozen is Unfreeze finding no ad-hoc freeze on the target.
var ErrNotFrozen = errors.New("no ad-hoc freeze on the target")

// FreezePrefix starts the name of every window Freeze adds.
const FreezePrefix = "freeze-"

// ValidateWindowReason checks the reason of a freeze or an override: not
// blank, at most buildlockv1.MaxWindowReasonLength characters, no control
// characters. The error wraps ErrInvalidReason.
func ValidateWindowReason(reason string) error {
	switch n := utf8.RuneCountInString(reason); {
	case strings.TrimSpace(reason) == "":
		return fmt.Errorf("%w: say why", ErrInvalidReason)
	case n > buildlockv1.MaxWindowReasonLength:
		return fmt.Errorf("%w: %d characters, more than the %d allowed", ErrInvalidReason, n, buildlockv1.MaxWindowReasonLength)
	case !branchPattern.MatchString(reason):
		return fmt.Errorf("%w: it must not contain control characters (newlines, tabs, escape sequences)", ErrInvalidReason)
	}
	return nil
}

// Frozen is what Freeze added.
type Frozen struct {
	// Window is the one-off Deny window added to the target's policy.
	Window buildlockv1.Window
	// Created says the policy did not exist and was created with it.
	Created bool
}

// Freeze freezes target in namespace from now until until, for reason: it
// adds a one-off Deny window named freeze-<start> to the target's
// BuildLockPolicy (creating the policy if there is none), with frozenBy set
// to the caller as the API server knows it (a SelfSubjectReview). It adds
// the window with a JSON patch, so that the policy's other windows are left
// as they are.
//
// c needs get, create and patch on buildlockpolicies, and create on
// selfsubjectreviews.
func Freeze(ctx context.Context, c client.Client, namespace, target, reason string, now, until time.Time) (*Frozen, error) {
	if err := ValidateWindowReason(reason); err != nil {
		return nil, err
	}
	if !until.After(now) {
		return nil, fmt.Errorf("the freeze must end after it starts (%s)", now.Format(time.RFC3339))
	}
	who := whoAmI(ctx, c)
	if who == "" {
		return nil, errors.New("cannot tell who you are (a SelfSubjectReview failed): a freeze records who froze")
	}
	start := now.UTC().Truncate(time.Second)
	w := buildlockv1.Window{
		Name: FreezePrefix + strings.ToLower(start.Format("20060102t150405z")), Kind: buildlockv1.WindowDeny,
		Start: buildlockv1.NewTimestamp(start), End: buildlockv1.NewTimestamp(until.UTC().Truncate(time.Second)),
		Reason: reason, FrozenBy: who,
	}
	key := types.NamespacedName{Namespace: namespace, Name: target}
	var p buildlockv1.BuildLockPolicy
	err := c.Get(ctx, key, &p)
	if apierrors.IsNotFound(err) {
		p = buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: target}}
		p.Spec.Windows = []buildlockv1.Window{w}
		if err := c.Create(ctx, &p); err != nil {
			return nil, fmt.Errorf("creating BuildLockPolicy %s/%s with a freeze: %w", namespace, target, err)
		}
		return &Frozen{Window: w, Created: true}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading BuildLockPolicy %s/%s: %w", namespace, target, err)
	}
	ops := []map[string]any{{"op": "add", "path": "/spec/windows/-", "value": w}}
	if len(p.Spec.Windows) == 0 {
		// No list to append to: create it, unless someone did meanwhile.
		ops = []map[string]any{{"op": "test", "path": "/metadata/resourceVersion", "value": p.ResourceVersion},
			{"op": "add", "path": "/spec/windows", "value": []buildlockv1.Window{w}}}
	}
	if err := jsonPatch(ctx, c, &p, ops); err != nil {
		return nil, err
	}
	return &Frozen{Window: w}, nil
}

// Unfreeze removes every ad-hoc freeze (window with frozenBy) from the
// target's policy, and returns them; each removal tests the window's name
// first, so that a concurrent edit of the list fails the patch rather than
// removing another window. Without one it fails with ErrNotFrozen.
//
// c needs get and patch on buildlockpolicies.
func Unfreeze(ctx context.Context, c client.Client, namespace, target string) ([]buildlockv1.Window, error) {
	var p buildlockv1.BuildLockPolicy
	if err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: target}, &p); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("%w: target %s in %s has no BuildLockPolicy", ErrNotFrozen, target, namespace)
		}
		return nil, fmt.Errorf("reading BuildLockPolicy %s/%s: %w", namespace, target, err)
	}
	var removed []buildlockv1.Window
	var ops []map[string]any
	// From the last, so that each index still points at its window.
	for i := len(p.Spec.Windows) - 1; i >= 0; i-- {
		w := p.Spec.Windows[i]
		if w.FrozenBy == "" {
			continue
		}
		path := fmt.Sprintf("/spec/windows/%d", i)
		ops = append(ops, map[string]any{"op": "test", "path": path + "/frozenBy", "value": w.FrozenBy},
			map[string]any{"op": "test", "path": path + "/name", "value": w.Name},
			map[string]any{"op": "remove", "path": path})
		removed = append(removed, w)
	}
	if len(removed) == 0 {
		return nil, fmt.Errorf("%w: BuildLockPolicy %s/%s has no window added by kubectl buildlock freeze", ErrNotFrozen, namespace, target)
	}
	if err := jsonPatch(ctx, c, &p, ops); err != nil {
		return nil, err
	}
	return removed, nil
}

// jsonPatch applies ops to policy p.
func jsonPatch(ctx context.Context, c client.Client, p *buildlockv1.BuildLockPolicy, ops []map[string]any) error {
	data, err := json.Marshal(ops)
	if err != nil {
		return fmt.Errorf("encoding a patch of BuildLockPolicy %s/%s: %w", p.Namespace, p.Name, err)
	}
	if err := c.Patch(ctx, p, client.RawPatch(types.JSONPatchType, data)); err != nil {
		return fmt.Errorf("patching BuildLockPolicy %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}

// Overridden is what Override set.
type Overridden struct {
	// Namespace and Name identify the BuildLock.
	Namespace, Name string
	// Expires is when the override lapses unused.
	Expires time.Time
}

// Override lets the BuildLock name in namespace be granted through a freeze
// of its target, once, until expires (at most buildlockv1.MaxOverrideFor
// after now): it annotates the claim with buildlockv1.OverrideAnnotation
// (the reason) and buildlockv1.OverrideExpiresAnnotation, with a patch
// guarded by the claim's UID. The API server stamps who did it
// (buildlockv1.OverriddenByAnnotation); the operator records an event when
// the override is used.
//
// c needs get and patch on buildlocks.
func Override(ctx context.Context, c client.Client, namespace, name, reason string, now, expires time.Time) (*Overridden, error) {
	if err := ValidateWindowReason(reason); err != nil {
		return nil, err
	}
	if !expires.After(now) || expires.Sub(now) > buildlockv1.MaxOverrideFor {
		return nil, fmt.Errorf("an override lasts more than nothing and at most %s", buildlockv1.MaxOverrideFor)
	}
	var bl buildlockv1.BuildLock
	if err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &bl); err != nil {
		return nil, fmt.Errorf("reading BuildLock %s/%s: %w", namespace, name, err)
	}
	if bl.Status.Phase.IsTerminal() {
		return nil, fmt.Errorf("%w: BuildLock %s/%s is %s already", ErrEnded, namespace, name, bl.Status.Phase)
	}
	expires = expires.UTC().Truncate(time.Second)
	err := patchClaim(ctx, c, &bl, map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		buildlockv1.OverrideAnnotation:        reason,
		buildlockv1.OverrideExpiresAnnotation: expires.Format(time.RFC3339),
	}}})
	if err != nil {
		return nil, err
	}
	return &Overridden{Namespace: namespace, Name: name, Expires: expires}, nil
}

// FreezeOf says whether the policy's status shows its target frozen, and if
// so until when and why, as a sentence: "staging is frozen until
// 2026-12-28T08:00:00+01:00 (holiday freeze)"; "" when open or unknown.
func FreezeOf(p *buildlockv1.BuildLockPolicy) string {
	if p == nil || p.Status.State != buildlockv1.WindowStateFrozen {
		return ""
	}
	until := "for more than a year"
	if p.Status.NextChange != nil {
		until = "until " + p.Status.NextChange.Format(time.RFC3339)
	}
	why := "outside its Allow windows"
	if len(p.Status.ActiveWindows) > 0 && p.Status.ActiveWindows[0].Kind == buildlockv1.WindowDeny {
		a := p.Status.ActiveWindows[0]
		why = cmp.Or(a.Reason, cmp.Or(a.Name, fmt.Sprintf("windows[%d]", a.Index)))
		if a.FrozenBy != "" {
			why += ", frozen by " + a.FrozenBy
		}
	}
	return fmt.Sprintf("%s is frozen %s (%s)", p.Name, until, why)
}

// ErrFrozen is the outcome of Acquire with WithFailIfFrozen when the
// claim's target is frozen: the claim was deleted.
var ErrFrozen = errors.New("the target is frozen")

// FrozenError is the ErrFrozen outcome.
type FrozenError struct {
	// Namespace and Name identify the BuildLock, which was deleted.
	Namespace, Name string
	// Message is the operator's: until when, and why.
	Message string
	// CleanupErr is set when the claim could not be deleted.
	CleanupErr error
}

func (e *FrozenError) Error() string {
	msg := fmt.Sprintf("BuildLock %s/%s waits for a frozen target: %s", e.Namespace, e.Name, e.Message)
	if e.CleanupErr != nil {
		msg += "; deleting the claim failed: " + e.CleanupErr.Error()
	}
	return msg
}

// Is makes errors.Is(err, ErrFrozen) true.
func (e *FrozenError) Is(target error) bool { return target == ErrFrozen }

// WithFailIfFrozen makes Acquire give up as soon as the operator says the
// claim waits because its target is frozen (reason Frozen): it deletes the
// claim and returns a *FrozenError.
func WithFailIfFrozen() Option {
	return func(o *options) { o.failIfFrozen = true }
}

// frozenVerdict is the outcome of a claim that waits for a frozen target
// (nil when it does not).
func frozenVerdict(bl *buildlockv1.BuildLock) error {
	if bl.Status.Phase != buildlockv1.PhaseWaiting || bl.Status.Reason != buildlockv1.ReasonFrozen {
		return nil
	}
	return &FrozenError{Namespace: bl.Namespace, Name: bl.Name, Message: bl.Status.Message}
}
