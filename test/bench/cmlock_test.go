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
	states, retries := acquireOnce(t, cs)
	if want := []cmState{cmHolding}; !slices.Equal(states, want) {
		t.Errorf("states %v, want %v", states, want)
	}
	if retries != 1 {
		t.Errorf("%d retries, want 1", retries)
	}
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
	states, retries := acquireOnce(t, cs)
	if want := []cmState{cmHolding}; !slices.Equal(states, want) {
		t.Errorf("states %v, want %v", states, want)
	}
	if retries != 2 {
		t.Errorf("%d retries, want 2", retries)
	}
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

func acquireOnce(t *testing.T, cs *fake.Clientset) (states []cmState, retries int) {
	t.Helper()
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
	return states, retries
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
