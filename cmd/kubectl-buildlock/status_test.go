package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

func TestSummarizeAndTable(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	claim := func(ns, name, target, repo string, build int64, phase buildlockv1.Phase, token int64, age time.Duration) buildlockv1.BuildLock {
		bl := buildlockv1.BuildLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(now.Add(-age))},
			Spec:       buildlockv1.BuildLockSpec{Target: target, Repo: repo, Branch: "main", Build: build},
			Status:     buildlockv1.BuildLockStatus{Phase: phase, FencingToken: token},
		}
		if phase == buildlockv1.PhaseHeld {
			at := metav1.NewMicroTime(now.Add(-age))
			bl.Status.AcquiredAt = &at
		}
		return bl
	}
	claims := []buildlockv1.BuildLock{
		claim("ci", "web-9", "staging", "acme/web", 9, buildlockv1.PhaseWaiting, 0, time.Minute),
		claim("ci", "shop-42", "staging", "acme/shop", 42, buildlockv1.PhaseHeld, 7, 3*time.Minute),
		claim("ci", "shop-41", "staging", "acme/shop", 41, buildlockv1.PhaseReleased, 6, time.Hour),
		claim("ci", "api-3", "prod", "acme/api", 3, "", 0, time.Second),
		claim("apps", "x-1", "staging", "acme/x", 1, buildlockv1.PhaseHeld, 1, 2*time.Hour),
	}
	locks := summarize(claims)
	if len(locks) != 3 {
		t.Fatalf("%d locks, want 3", len(locks))
	}
	staging := locks[2]
	if staging.Namespace != "ci" || staging.Target != "staging" || staging.Holder == nil || staging.Holder.Name != "shop-42" ||
		staging.Waiting == nil || staging.Waiting.Name != "web-9" || len(staging.Claims) != 3 || staging.Claims[0].Name != "web-9" {
		t.Errorf("ci/staging = %+v", staging)
	}
	if locks[1].Claims[0].Phase != buildlockv1.PhasePending {
		t.Errorf("an undecided claim shows %q, want Pending", locks[1].Claims[0].Phase)
	}

	var out bytes.Buffer
	printTable(&out, locks, true, now)
	// Ages read as kubectl's: 120m up to three hours.
	want := `NAMESPACE   TARGET    HOLDER                    WAITING            TOKEN
apps        staging   acme/x@main #1 (120m)     <none>             1
ci          prod      <none>                    <none>             -
ci          staging   acme/shop@main #42 (3m)   acme/web@main #9   7
`
	if out.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	printTable(&out, locks[2:], false, now)
	if !strings.HasPrefix(out.String(), "TARGET") {
		t.Errorf("a one-namespace table starts %q, want TARGET", strings.SplitN(out.String(), "\n", 2)[0])
	}
}
