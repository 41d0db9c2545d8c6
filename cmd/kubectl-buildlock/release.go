package main

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

func (a *app) release(ctx context.Context, args []string) int {
	o, err := parseRelease(args, a.env())
	if errors.Is(err, errHelp) {
		fmt.Fprint(a.stdout, commandHelp["release"])
		return exitOK
	}
	if err != nil {
		return a.usageError("release", err)
	}
	kc, err := a.connect(o.kube)
	if err != nil {
		return a.fail(err)
	}

	if o.name != "" {
		bl := &buildlockv1.BuildLock{}
		err := kc.Get(ctx, types.NamespacedName{Namespace: kc.Namespace, Name: o.name}, bl)
		if apierrors.IsNotFound(err) {
			fmt.Fprintf(a.stderr, "BuildLock %s/%s does not exist; nothing to release.\n", kc.Namespace, o.name)
			return exitOK
		}
		if err != nil {
			return a.fail(fmt.Errorf("reading BuildLock %s/%s: %w", kc.Namespace, o.name, err))
		}
		return a.deleteClaims(ctx, kc, []buildlockv1.BuildLock{*bl})
	}

	claims, err := listTarget(ctx, kc, kc.Namespace, o.target)
	if err != nil {
		return a.fail(err)
	}
	var mine []buildlockv1.BuildLock
	for _, bl := range claims {
		if bl.Spec.Repo == o.repo && bl.Spec.Branch == o.branch && bl.Spec.Build == o.build {
			mine = append(mine, bl)
		}
	}
	if len(mine) == 0 {
		fmt.Fprintf(a.stderr, "No claim of build %d of %s@%s on %s in %s; nothing to release.\n",
			o.build, o.repo, o.branch, o.target, kc.Namespace)
		return exitOK
	}
	return a.deleteClaims(ctx, kc, mine)
}

// deleteClaims deletes each claim if it is still the object that was read
// (its UID), and says what each was.
func (a *app) deleteClaims(ctx context.Context, kc *kubeClient, claims []buildlockv1.BuildLock) int {
	code := exitOK
	for i := range claims {
		bl := &claims[i]
		err := kc.Delete(ctx, bl, client.Preconditions{UID: &bl.UID})
		switch {
		case err == nil:
			fmt.Fprintf(a.stderr, "Released BuildLock %s/%s (%s).\n", bl.Namespace, bl.Name, describeClaim(bl))
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
			fmt.Fprintf(a.stderr, "BuildLock %s/%s is already gone.\n", bl.Namespace, bl.Name)
		default:
			fmt.Fprintf(a.stderr, "error: deleting BuildLock %s/%s: %v\n", bl.Namespace, bl.Name, err)
			code = exitError
		}
	}
	return code
}

// describeClaim says whose claim bl is and how it stands, for messages.
func describeClaim(bl *buildlockv1.BuildLock) string {
	s := fmt.Sprintf("build %d of %s@%s on %s", bl.Spec.Build, bl.Spec.Repo, bl.Spec.Branch, bl.Spec.Target)
	phase := bl.Status.Phase
	if phase == "" {
		phase = buildlockv1.PhasePending
	}
	s += ", " + string(phase)
	if phase == buildlockv1.PhaseHeld {
		s += fmt.Sprintf(" with token %d", bl.Status.FencingToken)
	}
	return s
}

// listTarget lists the claims on target in namespace ("" for all
// namespaces), all targets when target is "". spec.target is a selectable
// field of the CRD, so the API server filters.
func listTarget(ctx context.Context, c client.Reader, namespace, target string) ([]buildlockv1.BuildLock, error) {
	var list buildlockv1.BuildLockList
	opts := []client.ListOption{client.InNamespace(namespace)}
	if target != "" {
		opts = append(opts, client.MatchingFields{"spec.target": target})
	}
	if err := c.List(ctx, &list, opts...); err != nil {
		where := "in namespace " + namespace
		if namespace == "" {
			where = "in all namespaces"
		}
		if target != "" {
			return nil, fmt.Errorf("listing BuildLocks for target %q %s: %w", target, where, err)
		}
		return nil, fmt.Errorf("listing BuildLocks %s: %w", where, err)
	}
	return list.Items, nil
}
