package grant

import (
	"context"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

const floorNS = "ci"

// floorClient is a fake API server holding the namespace's token floor at
// token (none when token is 0), that counts the live reads of the floor.
func floorClient(t *testing.T, token int32, funcs interceptor.Funcs) (client.WithWatch, *int) {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := coordinationv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(scheme)
	if token > 0 {
		b = b.WithObjects(floorLease(token))
	}
	reads := 0
	get := funcs.Get
	funcs.Get = func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
		reads++
		if get != nil {
			return get(ctx, c, key, obj, opts...)
		}
		return c.Get(ctx, key, obj, opts...)
	}
	return interceptor.NewClient(b.Build(), funcs), &reads
}

func floorLease(token int32) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: floorNS, Name: TokenFloorLease, Labels: map[string]string{ManagedByLabel: ManagedByValue}},
		Spec:       coordinationv1.LeaseSpec{LeaseTransitions: ptr.To(token)},
	}
}

func floorOf(t *testing.T, c client.Client) int64 {
	t.Helper()
	floor, _, err := ReadTokenFloor(context.Background(), c, floorNS)
	if err != nil {
		t.Fatal(err)
	}
	return floor
}

// TestReserveStartsFromTheDecisionsRead: the floor the decision was taken
// on, read live a moment before, is where the raise starts; it is not read
// again.
func TestReserveStartsFromTheDecisionsRead(t *testing.T) {
	ctx := context.Background()
	c, reads := floorClient(t, 100, interceptor.Funcs{})
	floor, lease, err := ReadTokenFloor(ctx, c, floorNS)
	if err != nil {
		t.Fatal(err)
	}
	*reads = 0
	if err := Reserve(ctx, c, c, NewMemory(), floorNS, floor+1, &FloorRead{Token: floor, Lease: lease}); err != nil {
		t.Fatal(err)
	}
	if *reads != 0 {
		t.Errorf("Reserve read the floor %d times; want none (the decision's read stands until a raise loses a race)", *reads)
	}
	if got, want := floorOf(t, c), floor+ReservedTokens; got != want {
		t.Errorf("floor = %d, want %d", got, want)
	}
}

// TestReserveReadsAgainAfterALostRace: a raise on a read that another
// manager's raise overtook (an update's Conflict, or AlreadyExists when
// both found no floor and created it) reads the floor again, and raises it
// only if it still does not hold the token.
func TestReserveReadsAgainAfterALostRace(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// existing is the floor when the decision read it (0: none).
		existing int32
		// meanwhile is what another manager raised it to just before this
		// raise.
		meanwhile int32
		token     int64
		want      int64
	}{
		{"two creates: the other's holds the token", 0, 300, 1, 300},
		{"two creates: the other's is below the token", 0, 5, 8, 8 + ReservedTokens - 1},
		{"two updates: the other's holds the token", 100, 300, 101, 300},
		{"two updates: the other's is below the token", 100, 150, 151 + 50, 201 + ReservedTokens - 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raced := false
			race := func(ctx context.Context, c client.WithWatch) {
				raced = true
				var lease coordinationv1.Lease
				err := c.Get(ctx, types.NamespacedName{Namespace: floorNS, Name: TokenFloorLease}, &lease)
				switch {
				case apierrors.IsNotFound(err):
					if err := c.Create(ctx, floorLease(tc.meanwhile)); err != nil {
						t.Fatal(err)
					}
				case err == nil:
					lease.Spec.LeaseTransitions = ptr.To(tc.meanwhile)
					if err := c.Update(ctx, &lease); err != nil {
						t.Fatal(err)
					}
				default:
					t.Fatal(err)
				}
			}
			c, _ := floorClient(t, tc.existing, interceptor.Funcs{
				Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
					if !raced {
						race(ctx, c)
					}
					return c.Create(ctx, obj, opts...)
				},
				Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
					if !raced {
						race(ctx, c)
					}
					return c.Update(ctx, obj, opts...)
				},
			})
			floor, lease, err := ReadTokenFloor(ctx, c, floorNS)
			if err != nil {
				t.Fatal(err)
			}
			if err := Reserve(ctx, c, c, NewMemory(), floorNS, tc.token, &FloorRead{Token: floor, Lease: lease}); err != nil {
				t.Fatalf("Reserve: %v", err)
			}
			if got := floorOf(t, c); got != tc.want {
				t.Errorf("floor = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestReserveWritesNothingTheMemoryHolds: a token this manager's memory of
// the floor holds is reserved already.
func TestReserveWritesNothingTheMemoryHolds(t *testing.T) {
	ctx := context.Background()
	writes := 0
	c, reads := floorClient(t, 100, interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			writes++
			return c.Update(ctx, obj, opts...)
		},
	})
	mem := NewMemory()
	mem.Observe(floorLease(100))
	if err := Reserve(ctx, c, c, mem, floorNS, 100, nil); err != nil {
		t.Fatal(err)
	}
	if *reads != 0 || writes != 0 {
		t.Errorf("%d reads and %d writes of the floor; want none", *reads, writes)
	}
}
