package grant

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/buildlock/buildlock/internal/arbiter"
)

// TestFresherPrefersTheOwnWriteTheCacheDoesNotShowYet: a decision taken on
// the cache right after this manager's grant starts from that grant, not
// from the version before it; and from the cache's word as soon as the
// cache shows the write or anything later, the Lease is seen deleted, or
// the write is older than OwnWriteKept.
func TestFresherPrefersTheOwnWriteTheCacheDoesNotShowYet(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	key := types.NamespacedName{Namespace: "ci", Name: "buildlock-staging"}
	version := func(rv string, token int32) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name, ResourceVersion: rv},
			Spec: coordinationv1.LeaseSpec{LeaseTransitions: ptr.To(token)}}
	}
	for _, tc := range []struct {
		name    string
		written *coordinationv1.Lease // this manager's write at t0 (nil: none)
		deleted bool                  // the Lease was seen deleted after the write
		cached  *coordinationv1.Lease
		at      time.Duration // after t0
		wantRV  string        // "" : nil
		// thenRV is what a second call with the same cache returns: the
		// write is forgotten once the cache's word stands.
		thenRV string
	}{
		{"no write of this manager's", nil, false, version("90", 3), time.Millisecond, "90", "90"},
		{"the cache is a version behind the write", version("100", 4), false, version("90", 3), time.Millisecond, "100", "100"},
		{"the cache has no Lease yet: a create", version("100", 1), false, nil, time.Millisecond, "100", "100"},
		{"the cache shows the write", version("100", 4), false, version("100", 4), time.Millisecond, "100", "100"},
		{"the cache shows a later write (another manager's)", version("100", 4), false, version("120", 5), time.Millisecond, "120", "120"},
		{"the Lease was seen deleted since", version("100", 4), true, nil, time.Millisecond, "", ""},
		{"the write is older than it is kept", version("100", 4), false, version("90", 3), OwnWriteKept + time.Millisecond, "90", "90"},
		{"resourceVersions that do not compare", version("100", 4), false, version("x90", 3), time.Millisecond, "x90", "x90"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := NewMemory()
			if tc.written != nil {
				mem.Granted(tc.written, t0)
				if tc.deleted {
					mem.Deleted(tc.written)
				}
			}
			rv := func(l *coordinationv1.Lease) string {
				if l == nil {
					return ""
				}
				return l.ResourceVersion
			}
			if got := rv(mem.Fresher(key, tc.cached, t0.Add(tc.at))); got != tc.wantRV {
				t.Errorf("Fresher = version %q, want %q", got, tc.wantRV)
			}
			if got := rv(mem.Fresher(key, tc.cached, t0.Add(tc.at))); got != tc.thenRV {
				t.Errorf("then Fresher = version %q, want %q", got, tc.thenRV)
			}
		})
	}
	t.Run("a nil memory", func(t *testing.T) {
		var mem *Memory
		if got := mem.Fresher(key, nil, t0); got != nil {
			t.Errorf("Fresher = %v, want nil", got)
		}
	})
	t.Run("the Lease returned is a copy", func(t *testing.T) {
		mem := NewMemory()
		mem.Granted(version("100", 4), t0)
		mem.Fresher(key, nil, t0).Spec.LeaseTransitions = ptr.To(int32(99))
		if got := *mem.Fresher(key, nil, t0).Spec.LeaseTransitions; got != 4 {
			t.Errorf("the kept write's token became %d", got)
		}
	})
}

// TestLockFloorsAndForeignLeases: the namespace's floor noted for a
// version of a lock's Lease that this manager did not write is kept (the
// highest noted) until the lock is forgotten, and is known for that
// version only; a Lease of somebody else's is remembered until a live read
// finds none.
func TestLockFloorsAndForeignLeases(t *testing.T) {
	lock := arbiter.Lock{Namespace: "ci", Target: "staging"}
	mem := NewMemory()
	if mem.LockFloorKnown(lock, "7") || mem.LockFloor(lock) != 0 {
		t.Fatalf("a new memory knows a floor")
	}
	mem.NoteLockFloor(lock, "7", 200)
	if !mem.LockFloorKnown(lock, "7") || mem.LockFloorKnown(lock, "8") || mem.LockFloor(lock) != 200 {
		t.Errorf("after noting 200 for version 7: known(7)=%v known(8)=%v floor=%d", mem.LockFloorKnown(lock, "7"),
			mem.LockFloorKnown(lock, "8"), mem.LockFloor(lock))
	}
	mem.NoteLockFloor(lock, "8", 100) // a stale floor read never lowers it
	if !mem.LockFloorKnown(lock, "8") || mem.LockFloor(lock) != 200 {
		t.Errorf("after noting 100 for version 8: floor=%d, want 200", mem.LockFloor(lock))
	}
	mem.ObserveToken(lock, 250)
	mem.ForgetUpTo(lock, 240) // a token above the floor: kept
	if mem.LockFloor(lock) != 200 {
		t.Errorf("forgotten while a token above the namespace's floor was remembered")
	}
	mem.ForgetUpTo(lock, 300)
	if mem.LockFloor(lock) != 0 || mem.LockFloorKnown(lock, "8") {
		t.Errorf("a forgotten lock keeps its floor")
	}

	theirs := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "buildlock-staging", ResourceVersion: "3"}}
	mem.NoteForeign(lock, theirs)
	theirs.ResourceVersion = "changed"
	if f := mem.Foreign(lock); f == nil || f.ResourceVersion != "3" {
		t.Errorf("Foreign = %v, want the Lease noted (a copy)", f)
	}
	mem.NoteForeign(lock, nil)
	if f := mem.Foreign(lock); f != nil {
		t.Errorf("Foreign = %v after a live read found none", f)
	}
	var none *Memory
	none.NoteLockFloor(lock, "1", 5)
	none.NoteForeign(lock, theirs)
	if none.LockFloor(lock) != 0 || none.LockFloorKnown(lock, "1") || none.Foreign(lock) != nil {
		t.Errorf("a nil memory remembers")
	}
}
