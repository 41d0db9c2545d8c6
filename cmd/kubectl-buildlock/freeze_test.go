package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// TestFreezeOverrideAndUnfreeze drives a freeze through the plugin as the
// issue's people and pipelines do: a person freezes, a pipeline's acquire
// waits (or fails fast with --fail-if-frozen), the pipeline can neither
// unfreeze nor override, a person overrides one claim through the freeze,
// and unfreezes.
func TestFreezeOverrideAndUnfreeze(t *testing.T) {
	f := newFixture(t)
	asAdmin := func(args ...string) (int, *proc) {
		t.Helper()
		p := f.pluginAs(f.adminKubeconfig, nil, args...)
		return p.wait(t, time.Minute), p
	}
	if code, p := asAdmin("freeze", "staging", "--reason", "incident 4711"); code != exitUsage || !strings.Contains(p.stderr.String(), "--for DURATION or --until TIME") {
		t.Errorf("freeze without --for exited %d:\n%s", code, p.stderr)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"freeze", "staging", "--for", "2h"}, "missing --reason: say why the target is frozen"},
		{[]string{"freeze", "staging", "--for", "2h", "--reason", "a\tb"}, "--reason: invalid reason: it must not contain control characters"},
		{[]string{"override", "some-claim"}, "missing --reason: say why this claim goes through the freeze"},
	} {
		code, p := asAdmin(tc.args...)
		if code != exitUsage || !strings.Contains(p.stderr.String(), tc.want) || strings.Contains(p.stderr.String(), "force-release") {
			t.Errorf("%q exited %d, want %d and %q:\n%s", tc.args, code, exitUsage, tc.want, p.stderr)
		}
	}
	code, p := asAdmin("freeze", "staging", "--for", "2h", "--reason", "incident 4711")
	if code != exitOK || !strings.Contains(p.stderr.String(), "Froze staging in "+f.ns+" until ") {
		t.Fatalf("freeze exited %d:\n%s", code, p.stderr)
	}
	var policy buildlockv1.BuildLockPolicy
	must(t, admin.Get(context.Background(), types.NamespacedName{Namespace: f.ns, Name: "staging"}, &policy))
	if ws := policy.Spec.Windows; len(ws) != 1 || ws[0].FrozenBy == "" || ws[0].Reason != "incident 4711" || ws[0].Kind != buildlockv1.WindowDeny {
		t.Fatalf("windows after freeze: %+v", ws)
	}

	code, p = f.run(nil, "acquire", "--target", "staging", "--repo", "acme/shop", "--branch", "main", "--build", "41", "--fail-if-frozen")
	if code != exitFrozen || !strings.Contains(p.stderr.String(), "staging is frozen until") || f.get("acme-shop-main-41-staging") != nil {
		t.Errorf("acquire --fail-if-frozen exited %d, want %d, and deleted its claim:\n%s", code, exitFrozen, p.stderr)
	}

	waiter := f.plugin(nil, "acquire", "--target", "staging", "--repo", "acme/shop", "--branch", "main", "--build", "42")
	claim := "acme-shop-main-42-staging"
	f.eventually(30*time.Second, "acquire says the target is frozen", func() bool {
		return strings.Contains(waiter.stderr.String(), "Waiting: staging is frozen until") &&
			strings.Contains(waiter.stderr.String(), "(incident 4711); this build keeps its place")
	})
	if code, p := f.run(nil, "status"); code != exitOK || !strings.HasPrefix(p.stdout.String(), "staging is frozen until") {
		t.Errorf("status exited %d; it says the freeze first:\n%s%s", code, p.stdout, p.stderr)
	}

	// Pipelines: RBAC refuses their freezes; the override policy their overrides.
	if code, p := f.run(nil, "unfreeze", "staging"); code != exitError || !strings.Contains(p.stderr.String(), "forbidden") {
		t.Errorf("a pipeline's unfreeze exited %d, want 1 (forbidden):\n%s", code, p.stderr)
	}
	if code, p := f.run(nil, "freeze", "prod", "--for", "1h", "--reason", "mine"); code != exitError || !strings.Contains(p.stderr.String(), "forbidden") {
		t.Errorf("a pipeline's freeze exited %d, want 1 (forbidden):\n%s", code, p.stderr)
	}
	asServiceAccount := []string{"--as", "system:serviceaccount:" + f.ns + ":pipeline", "--as-group", "system:serviceaccounts"}
	if code, p := asAdmin(append(asServiceAccount, "override", claim, "--reason", "let me through")...); code != exitError ||
		!strings.Contains(p.stderr.String(), "Overriding a freeze is for people") {
		t.Errorf("a pipeline's override exited %d, want 1 (refused):\n%s", code, p.stderr)
	}

	code, p = asAdmin("override", claim, "--reason", "hotfix for incident 4711", "--for", "30m")
	if code != exitOK || !strings.Contains(p.stderr.String(), "Overrode the freeze for BuildLock "+f.ns+"/"+claim) {
		t.Fatalf("override exited %d:\n%s", code, p.stderr)
	}
	if code := waiter.wait(t, time.Minute); code != exitOK || waiter.stdout.String() != "1\n" {
		t.Fatalf("the overridden acquire exited %d: %q\n%s", code, waiter.stdout, waiter.stderr)
	}
	bl := f.get(claim)
	if by := bl.Annotations[buildlockv1.OverriddenByAnnotation]; by == "" || strings.HasPrefix(by, "system:serviceaccount:") {
		t.Errorf("overridden-by = %q, want the person's user name", by)
	}

	if code, p := asAdmin("unfreeze", "staging"); code != exitOK || !strings.Contains(p.stderr.String(), "Removed freeze freeze-") {
		t.Errorf("unfreeze exited %d:\n%s", code, p.stderr)
	}
	must(t, admin.Get(context.Background(), types.NamespacedName{Namespace: f.ns, Name: "staging"}, &policy))
	if len(policy.Spec.Windows) != 0 {
		t.Errorf("windows after unfreeze: %+v", policy.Spec.Windows)
	}
	if code, p := asAdmin("unfreeze", "staging"); code != exitError || !strings.Contains(p.stderr.String(), "no window added by kubectl buildlock freeze") {
		t.Errorf("a second unfreeze exited %d, want 1:\n%s", code, p.stderr)
	}
}
