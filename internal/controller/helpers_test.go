package controller_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/gomega"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// newNamespace creates a namespace of its own for one spec, so that specs
// never share a lock.
func newNamespace() string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bl-"}}
	Expect(k8sClient.Create(ctx, ns)).To(Succeed())
	return ns.Name
}

// claimOpts describe a BuildLock to create.
type claimOpts struct {
	target, repo, branch string
	build                int64
	pod                  string
	expiresAfter         time.Duration
	timestamp            time.Time
}

func newClaim(ns, name string, o claimOpts) *buildlockv1.BuildLock {
	if o.target == "" {
		o.target = "staging"
	}
	if o.branch == "" {
		o.branch = "main"
	}
	bl := &buildlockv1.BuildLock{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: buildlockv1.BuildLockSpec{
			Target: o.target, Repo: o.repo, Branch: o.branch, Build: o.build,
		},
	}
	if o.pod != "" {
		bl.Spec.PodRef = &buildlockv1.PodReference{Name: o.pod}
	}
	if o.expiresAfter != 0 {
		bl.Spec.ExpiresAfter = &metav1.Duration{Duration: o.expiresAfter}
	}
	if !o.timestamp.IsZero() {
		bl.Spec.Timestamp = buildlockv1.NewTimestamp(o.timestamp)
	}
	return bl
}

// createClaim creates a claim (and its pod, if it names one that does not
// exist yet) and returns it.
func createClaim(ns, name string, o claimOpts) *buildlockv1.BuildLock {
	if o.pod != "" {
		createPod(ns, o.pod)
	}
	bl := newClaim(ns, name, o)
	Expect(k8sClient.Create(ctx, bl)).To(Succeed())
	return bl
}

func createPod(ns, name string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "build", Image: "busybox"}}},
	}
	err := k8sClient.Create(ctx, pod)
	if apierrors.IsAlreadyExists(err) {
		return pod
	}
	Expect(err).NotTo(HaveOccurred())
	return pod
}

// setPodPhase plays the kubelet: there is none in envtest.
func setPodPhase(ns, name string, phase corev1.PodPhase) {
	var pod corev1.Pod
	Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &pod)).To(Succeed())
	pod.Status.Phase = phase
	Expect(k8sClient.Status().Update(ctx, &pod)).To(Succeed())
}

func getClaim(g Gomega, ns, name string) *buildlockv1.BuildLock {
	var bl buildlockv1.BuildLock
	g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &bl)).To(Succeed())
	return &bl
}

// expectPhase waits until the claim shows phase (read from the API server,
// not a cache) and returns it.
func expectPhase(ns, name string, phase buildlockv1.Phase) *buildlockv1.BuildLock {
	var bl *buildlockv1.BuildLock
	EventuallyWithOffset(1, func(g Gomega) {
		bl = getClaim(g, ns, name)
		g.Expect(bl.Status.Phase).To(Equal(phase), "claim %s: reason %q, message %q", name, bl.Status.Reason, bl.Status.Message)
	}).Should(Succeed())
	return bl
}

func getLease(g Gomega, ns, target string) *coordinationv1.Lease {
	var lease coordinationv1.Lease
	g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: buildlockv1.GrantLeaseName(target)}, &lease)).To(Succeed())
	return &lease
}

// expectGrant waits until the target's Lease names holder with token.
func expectGrant(ns, target string, holder *buildlockv1.BuildLock, token int32) {
	EventuallyWithOffset(1, func(g Gomega) {
		lease := getLease(g, ns, target)
		g.Expect(lease.Spec.HolderIdentity).To(HaveValue(Equal(fmt.Sprintf("%s/%s", holder.Name, holder.UID))))
		g.Expect(lease.Spec.LeaseTransitions).To(HaveValue(Equal(token)))
	}).Should(Succeed())
}

// heldClaims lists the claims of a target whose status says Held.
func heldClaims(g Gomega, ns, target string) []string {
	var list buildlockv1.BuildLockList
	g.Expect(k8sClient.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
	var held []string
	for _, bl := range list.Items {
		if bl.Spec.Target == target && bl.Status.Phase == buildlockv1.PhaseHeld {
			held = append(held, bl.Name)
		}
	}
	return held
}

// eventReasons lists the reasons of the events regarding a claim.
func eventReasons(g Gomega, ns, name string) []string {
	var list eventsv1.EventList
	g.Expect(k8sClient.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
	var reasons []string
	for _, e := range list.Items {
		if e.Regarding.Name == name {
			reasons = append(reasons, e.Reason)
		}
	}
	return reasons
}

// poke changes an annotation on a claim, which makes the controller decide
// its lock again (as any event would) without changing its spec. It patches
// metadata only: a Get and Update through a Go client would rewrite the
// spec's defaulted expiresAfter ("1h" comes back as "1h0m0s"), a real spec
// change that bumps the generation.
func poke(ns, name string) {
	bl := &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{"test.buildlock.io/poke":%q}}}`, time.Now().Format(time.RFC3339Nano))
	Expect(k8sClient.Patch(ctx, bl, client.RawPatch(types.MergePatchType, []byte(patch)))).To(Succeed())
}

// writeCounter counts the writes a manager's client makes, by namespace
// (the manager watches every namespace, and other specs' locks may still be
// settling), and can fail some of them with injected conflicts.
type writeCounter struct {
	mu       sync.Mutex
	writes   map[string]int // namespace → writes that reached the API server
	injected int
	// conflicts, when positive, is how many of the next writes fail with a
	// Conflict before reaching the API server.
	conflicts atomic.Int32
}

func newWriteCounter() *writeCounter { return &writeCounter{writes: map[string]int{}} }

func (w *writeCounter) add(obj client.Object) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conflicts.Load() > 0 && w.conflicts.Add(-1) >= 0 {
		w.injected++
		return apierrors.NewConflict(buildlockv1.GroupVersion.WithResource("buildlocks").GroupResource(), "injected", fmt.Errorf("injected by the test"))
	}
	w.writes[obj.GetNamespace()]++
	return nil
}

// total is the number of writes in namespace ns that reached the API server.
func (w *writeCounter) total(ns string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writes[ns]
}

// injectedConflicts is the number of writes failed with a Conflict.
func (w *writeCounter) injectedConflicts() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.injected
}

func (w *writeCounter) funcs() *interceptor.Funcs {
	return &interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if err := w.add(obj); err != nil {
				return err
			}
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if err := w.add(obj); err != nil {
				return err
			}
			return c.Update(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if err := w.add(obj); err != nil {
				return err
			}
			return c.Patch(ctx, obj, patch, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if err := w.add(obj); err != nil {
				return err
			}
			return c.Delete(ctx, obj, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			if err := w.add(obj); err != nil {
				return err
			}
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if err := w.add(obj); err != nil {
				return err
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	}
}

// offsetClock is the manager's clock, shifted by an offset the test moves
// forward to make time pass.
type offsetClock struct{ offset atomic.Int64 }

func (c *offsetClock) Now() time.Time                  { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *offsetClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c *offsetClock) advance(d time.Duration)         { c.offset.Add(int64(d)) }

// rbacRole sets up a pipeline's identity in one namespace: a user bound to a
// Role with the rights a pipeline gets (no status, no Leases).
type rbacRole struct{ ns string }

func (r *rbacRole) pipelineUser() client.Client {
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: "pipeline"},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{buildlockv1.GroupVersion.Group},
			Resources: []string{"buildlocks"},
			Verbs:     []string{"create", "get", "list", "watch", "delete", "patch"},
		}},
	}
	Expect(k8sClient.Create(ctx, role)).To(Succeed())
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: "pipeline"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pipeline"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "pipeline-" + r.ns}},
	}
	Expect(k8sClient.Create(ctx, binding)).To(Succeed())
	user, err := testEnv.AddUser(envtest.User{Name: "pipeline-" + r.ns}, nil)
	Expect(err).NotTo(HaveOccurred())
	c, err := client.New(user.Config(), client.Options{Scheme: k8sClient.Scheme()})
	Expect(err).NotTo(HaveOccurred())
	return c
}
