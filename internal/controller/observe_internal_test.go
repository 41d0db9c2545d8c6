package controller

import (
	"context"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/buildlock/buildlock/internal/arbiter"
	"github.com/buildlock/buildlock/internal/controller/grant"
)

// countingReader counts the Gets of a reader.
type countingReader struct {
	client.Reader
	gets int
}

func (r *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	r.gets++
	return r.Reader.Get(ctx, key, obj, opts...)
}

// TestNoteLockFloorReadsOncePerVersionItDidNotWrite (bug 15): a version of
// the grant Lease that this manager did not write (found after a start, or
// written by somebody else) makes the lock's next token go above the
// namespace's floor as it was then, read once for that version; the
// versions this manager wrote read nothing, so hand-offs cost no read.
func TestNoteLockFloorReadsOncePerVersionItDidNotWrite(t *testing.T) {
	lock := arbiter.Lock{Namespace: "ci", Target: "staging"}
	floor := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: grant.TokenFloorLease},
		Spec: coordinationv1.LeaseSpec{LeaseTransitions: ptr.To(int32(200))}}
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(floor).Build()
	reader := &countingReader{Reader: c}
	mem := grant.NewMemory()
	o := observer{memory: mem}
	version := func(rv string, token int32) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "buildlock-staging", ResourceVersion: rv},
			Spec: coordinationv1.LeaseSpec{LeaseTransitions: ptr.To(token)}}
	}
	note := func(l *coordinationv1.Lease) {
		t.Helper()
		if err := o.noteLockFloor(context.Background(), reader, lock, l); err != nil {
			t.Fatal(err)
		}
	}

	note(version("7", 1)) // found after a start, lowered by a person
	if reader.gets != 1 || mem.LockFloor(lock) != 200 {
		t.Errorf("a version found after a start: %d reads, lock floor %d; want 1 read, 200", reader.gets, mem.LockFloor(lock))
	}
	note(version("7", 1))
	if reader.gets != 1 {
		t.Errorf("the same version read the floor again")
	}
	own := version("8", 201)
	mem.Wrote(own)
	note(own)
	if reader.gets != 1 {
		t.Errorf("a version this manager wrote read the floor")
	}
	floor.Spec.LeaseTransitions = ptr.To(int32(300))
	if err := c.Update(context.Background(), floor); err != nil {
		t.Fatal(err)
	}
	note(version("9", 2)) // somebody else's edit
	if reader.gets != 2 || mem.LockFloor(lock) != 300 {
		t.Errorf("an edit of somebody else's: %d reads, lock floor %d; want 2 reads, 300", reader.gets, mem.LockFloor(lock))
	}
	if _, g := arbiterInputs(observation{lease: own}, mem.Highest(lock), mem.LockFloor(lock)); g.Reserved != 300 {
		t.Errorf("the arbiter's Reserved is %d, want the lock floor 300", g.Reserved)
	}
}
