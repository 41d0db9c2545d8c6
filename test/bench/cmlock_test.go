//go:build bench

package bench

import (
	"context"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// These run without an API server: go test -tags bench -run '^TestCMLock' .

// A create the API server made but whose answer was lost leaves the bidder
// holding the lock: its retry must find its own ConfigMap, not wait on it.
func TestCMLockAcquireRecoversALostCreate(t *testing.T) {
	cs := fake.NewClientset()
	lost := true
	cs.PrependReactor("create", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !lost {
			return false, nil, nil
		}
		lost = false
		obj := a.(k8stesting.CreateAction).GetObject()
		if err := cs.Tracker().Create(a.GetResource(), obj, a.GetNamespace()); err != nil {
			t.Fatal(err)
		}
		return true, nil, io.ErrUnexpectedEOF
	})
	wantHeldAfterRetries(t, cs, 1)
}

// A create that failed before the API server made it is sent again.
func TestCMLockAcquireRetriesAFailedCreate(t *testing.T) {
	cs := fake.NewClientset()
	fails := 2
	cs.PrependReactor("create", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		if fails == 0 {
			return false, nil, nil
		}
		fails--
		return true, nil, errors.New("connection refused")
	})
	wantHeldAfterRetries(t, cs, 2)
}

// A latency run's contender still fails at its first failed request.
func TestCMLockAcquireFailsWhenToldNotToRetry(t *testing.T) {
	cs := fake.NewClientset()
	cs.PrependReactor("create", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	l := &cmLocker{cs: cs, ns: "ns"}
	_, err := l.acquire(context.Background(), testBid(), func(cmState, time.Time) {}, failOnError)
	if err == nil {
		t.Fatal("acquire succeeded; want the create's error")
	}
}

// wantHeldAfterRetries acquires the lock with cs and wants it held, with no
// other state reported on the way, after that many retries.
func wantHeldAfterRetries(t *testing.T, cs *fake.Clientset, want int) {
	t.Helper()
	var states []cmState
	retries := 0
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l := &cmLocker{cs: cs, ns: "ns"}
	release, err := l.acquire(ctx, testBid(), func(s cmState, _ time.Time) { states = append(states, s) },
		func(error) bool { retries++; return true })
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	if err := release(ctx); err != nil {
		t.Errorf("release: %v", err)
	}
	if !slices.Equal(states, []cmState{cmHolding}) {
		t.Errorf("states %v, want only %v", states, cmHolding)
	}
	if retries != want {
		t.Errorf("%d retries, want %d", retries, want)
	}
}

func testBid() cmBid {
	return cmBid{Target: "staging", Repo: "acme/shop", Branch: "main", Build: 1, Stamp: time.Now()}
}

// Stamps compare as strings in the order of their times, whatever their
// trailing zeros.
func TestCMStampsSortAsTimes(t *testing.T) {
	base := time.Date(2026, 12, 1, 5, 20, 0, 100000000, time.UTC) // .1 s: RFC3339Nano would write "00.1Z"
	later := base.Add(20 * time.Millisecond)                      // .12 s
	a, b := cmBid{Stamp: base}.data()["stamp"], cmBid{Stamp: later}.data()["stamp"]
	if !(a < b) {
		t.Errorf("stamp %q of the earlier bid does not sort before %q", a, b)
	}
}
