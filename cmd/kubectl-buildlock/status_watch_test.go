package main

import (
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// TestStatusWatchShowsEachChangeUntilInterrupted: status --watch shows the
// lock as it is, then again when a build starts waiting and when the holder
// releases, and exits 0 on SIGINT.
func TestStatusWatchShowsEachChangeUntilInterrupted(t *testing.T) {
	f := newFixture(t)
	holder := f.hold("staging")
	watch := f.plugin(nil, "status", "--target", "staging", "--watch")
	pictures := func() []string { return strings.Split(watch.stdout.String(), "\nTARGET")[1:] }
	f.eventually(30*time.Second, "the first picture: staging's holder", func() bool {
		p := pictures()
		return len(p) == 1 && regexp.MustCompile(`holder\s+acme/holder@main #1\s+Held\s+1`).MatchString(p[0])
	})

	waiter := f.plugin(nil, "acquire", "--target", "staging", "--repo", "acme/shop", "--branch", "main", "--build", "9")
	f.waitForPhase("acme-shop-main-9-staging", buildlockv1.PhaseWaiting)
	f.eventually(30*time.Second, "a picture with the waiting build", func() bool {
		p := pictures()
		return len(p) >= 2 && regexp.MustCompile(`1 \(next\)\s+acme/shop@main #9\s+Waiting`).MatchString(p[len(p)-1])
	})

	code, p := f.run(nil, "release", holder)
	if code != exitOK {
		t.Fatalf("release exited %d:\n%s", code, p.stderr)
	}
	f.eventually(30*time.Second, "a picture with the waiter holding", func() bool {
		p := pictures()
		return regexp.MustCompile(`holder\s+acme/shop@main #9\s+Held\s+2`).MatchString(p[len(p)-1])
	})
	n := len(pictures())
	time.Sleep(time.Second)
	if got := len(pictures()); got != n {
		t.Errorf("%d pictures became %d with nothing changing:\n%s", n, got, watch.stdout)
	}

	watch.signal(t, syscall.SIGINT)
	if code := watch.wait(t, 30*time.Second); code != exitOK {
		t.Errorf("status --watch exited %d on SIGINT, want 0:\n%s", code, watch.stderr)
	}
	if code := waiter.wait(t, 30*time.Second); code != exitOK {
		t.Errorf("the waiter's acquire exited %d:\n%s", code, waiter.stderr)
	}
}
