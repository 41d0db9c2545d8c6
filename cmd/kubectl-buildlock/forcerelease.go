package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/pkg/lock"
)

// eventReasonForceRelease is the reason of the event force-release records.
const eventReasonForceRelease = "ForceRelease"

func (a *app) forceRelease(ctx context.Context, args []string) int {
	o, err := parseForceRelease(args)
	if errors.Is(err, errHelp) {
		fmt.Fprint(a.stdout, commandHelp["force-release"])
		return exitOK
	}
	if err != nil {
		return a.usageError("force-release", err)
	}
	kc, err := a.connect(o.kube)
	if err != nil {
		return a.fail(err)
	}
	claims, err := listTarget(ctx, kc, kc.Namespace, o.target)
	if err != nil {
		return a.fail(err)
	}
	holder := holderOf(claims)
	if holder == nil {
		return a.fail(fmt.Errorf("no claim holds %s in namespace %s; nothing to force-release (see kubectl buildlock status)", o.target, kc.Namespace))
	}

	who := whoAmI(ctx, kc)
	value := who + ": " + o.reason
	if err := annotateForceRelease(ctx, kc, holder, value); err != nil {
		return a.fail(err)
	}
	fmt.Fprintf(a.stderr, "Annotated BuildLock %s/%s (%s) with %s=%q.\n",
		holder.Namespace, holder.Name, describeClaim(holder), lock.ForceReleaseAnnotation, value)

	ev := forceReleaseEvent(holder, who, o.reason, time.Now())
	if err := kc.Create(ctx, ev); err != nil {
		// The annotation is what the operator acts on; the event is the record.
		fmt.Fprintf(a.stderr, "warning: recording the event failed: %v\n", err)
	} else {
		fmt.Fprintf(a.stderr, "Recorded Warning event %s on it: %s\n", ev.Reason, ev.Message)
	}
	fmt.Fprintf(a.stderr, "The operator ends the hold at its next decision (Released, reason ForceReleased) and grants %s to the waiting build, if any.\n", o.target)
	return exitOK
}

// holderOf is the claim shown Held (the newest grant, if a hand-off shows
// two), or nil.
func holderOf(claims []buildlockv1.BuildLock) *buildlockv1.BuildLock {
	var holder *buildlockv1.BuildLock
	for i := range claims {
		bl := &claims[i]
		if bl.Status.Phase == buildlockv1.PhaseHeld && (holder == nil || bl.Status.FencingToken > holder.Status.FencingToken) {
			holder = bl
		}
	}
	return holder
}

// whoAmI asks the API server who the caller is (a SelfSubjectReview), or
// says "unknown".
func whoAmI(ctx context.Context, c client.Client) string {
	review := &authenticationv1.SelfSubjectReview{}
	if err := c.Create(ctx, review); err != nil || review.Status.UserInfo.Username == "" {
		return "unknown"
	}
	return review.Status.UserInfo.Username
}

// annotateForceRelease sets the force-release annotation on bl with a merge
// patch that carries bl's UID, so that it never lands on a newer claim of
// the same name.
func annotateForceRelease(ctx context.Context, c client.Client, bl *buildlockv1.BuildLock, value string) error {
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{
			"uid":         bl.UID,
			"annotations": map[string]string{lock.ForceReleaseAnnotation: value},
		},
	})
	if err != nil {
		return fmt.Errorf("encoding the annotation: %w", err)
	}
	target := &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: bl.Namespace, Name: bl.Name}}
	if err := c.Patch(ctx, target, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("annotating BuildLock %s/%s: %w", bl.Namespace, bl.Name, err)
	}
	return nil
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
		Reason: eventReasonForceRelease,
		Message: fmt.Sprintf("%s asked to end the hold of build %d of %s@%s on %s (token %d): %s",
			who, bl.Spec.Build, bl.Spec.Repo, bl.Spec.Branch, bl.Spec.Target, bl.Status.FencingToken, reason),
		Type:                corev1.EventTypeWarning,
		Source:              corev1.EventSource{Component: "kubectl-buildlock"},
		FirstTimestamp:      t,
		LastTimestamp:       t,
		Count:               1,
		ReportingController: "buildlock.io/kubectl-buildlock",
	}
}
