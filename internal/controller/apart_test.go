package controller_test

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// failing is a fault injected into a manager's client: every write that
// matches fails with an internal error, and is counted.
type failing struct {
	match  func(verb string, obj client.Object) bool
	failed atomic.Int32
}

func (f *failing) fail(verb string, obj client.Object) error {
	if !f.match(verb, obj) {
		return nil
	}
	f.failed.Add(1)
	return apierrors.NewInternalError(errors.New("injected by the test"))
}

func (f *failing) funcs() interceptor.Funcs {
	return interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if err := f.fail("create", obj); err != nil {
				return err
			}
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if err := f.fail("update", obj); err != nil {
				return err
			}
			return c.Update(ctx, obj, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if err := f.fail("delete", obj); err != nil {
				return err
			}
			return c.Delete(ctx, obj, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			if err := f.fail("update "+sub, obj); err != nil {
				return err
			}
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	}
}

// startFailing starts a manager watching ns whose writes that match fail.
func startFailing(o testenv.ManagerOptions, ns string, match func(verb string, obj client.Object) bool) *failing {
	GinkgoHelper()
	f := &failing{match: match}
	o.NewClient = testenv.InterceptClient(f.funcs())
	startScopedManager(o, ns)
	return f
}

// expectReady waits until the policy of target in ns shows Ready with
// reason.
func expectReady(ns, target, reason string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		var p buildlockv1.BuildLockPolicy
		g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: target}, &p)).To(Succeed())
		g.Expect(meta.FindStatusCondition(p.Status.Conditions, buildlockv1.ConditionReady)).To(HaveValue(HaveField("Reason", reason)))
	}).Should(Succeed())
}

var _ = Describe("A controller that fails", func() {
	It("stops no hand-off when the enforcement binding cannot be written", func() {
		ns := newNamespace()
		target := "ap-" + ns[len("bl-"):]
		namespaceNamed(target, map[string]string{buildlockv1.LockedByLabel: ns})
		bindings := startFailing(testenv.ManagerOptions{}, ns, func(_ string, obj client.Object) bool {
			_, ok := obj.(*admissionv1.ValidatingAdmissionPolicyBinding)
			return ok
		})
		policy := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: target}}
		policy.Spec.Enforce = &buildlockv1.Enforcement{}
		Expect(k8sClient.Create(ctx, policy)).To(Succeed())
		holderAndWaiter(ns, target)
		setPodPhase(ns, "shop-41", corev1.PodSucceeded)
		Expect(expectPhase(ns, "web-7", buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(int64(2)))
		expectReady(ns, target, buildlockv1.ReasonApplied)
		Expect(bindings.failed.Load()).To(BeNumerically(">", 0), "the binding's writes failed all along")
	})

	It("reports the policy although the grant Lease cannot be written", func() {
		ns := newNamespace()
		leases := startFailing(testenv.ManagerOptions{}, ns, func(_ string, obj client.Object) bool {
			_, ok := obj.(*coordinationv1.Lease)
			return ok
		})
		createPolicy(ns, buildlockv1.OrderingQueue)
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectReady(ns, "staging", buildlockv1.ReasonApplied)
		// The policy's status may come before the grant's first write (a
		// live read of the token floor precedes it).
		Eventually(leases.failed.Load).Should(BeNumerically(">", 0), "the grant's writes failed all along")
		Expect(getClaim(Default, ns, "shop-41").Status.Phase).NotTo(Equal(buildlockv1.PhaseHeld), "no grant without its Lease")
	})

	It("deletes finished claims although the policy's status cannot be written", func() {
		ns := newNamespace()
		statuses := startFailing(testenv.ManagerOptions{FinishedTTL: time.Second}, ns, func(verb string, obj client.Object) bool {
			_, ok := obj.(*buildlockv1.BuildLockPolicy)
			return ok && verb == "update status"
		})
		createPolicy(ns, buildlockv1.OrderingNewestWins)
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		createClaim(ns, "shop-40", claimOpts{repo: "acme/shop", build: 40, pod: "shop-40"})
		expectPhase(ns, "shop-40", buildlockv1.PhaseSuperseded)
		Eventually(func() bool {
			return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "shop-40"}, &buildlockv1.BuildLock{}))
		}).Should(BeTrue(), "the finished claim is deleted after --finished-ttl")
		Expect(statuses.failed.Load()).To(BeNumerically(">", 0), "the policy's status writes failed all along")
	})

	It("decides and reports the policy although finished claims cannot be deleted", func() {
		ns := newNamespace()
		deletes := startFailing(testenv.ManagerOptions{FinishedTTL: time.Millisecond}, ns, func(verb string, obj client.Object) bool {
			_, ok := obj.(*buildlockv1.BuildLock)
			return ok && verb == "delete"
		})
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		expectPhase(ns, "web-7", buildlockv1.PhaseWaiting)
		setPodPhase(ns, "shop-41", corev1.PodSucceeded)
		expectPhase(ns, "web-7", buildlockv1.PhaseHeld)
		Eventually(deletes.failed.Load).Should(BeNumerically(">", 0), "the finished claim's deletes fail")
		createPolicy(ns, buildlockv1.OrderingQueue)
		expectReady(ns, "staging", buildlockv1.ReasonApplied)
		setPodPhase(ns, "web-7", corev1.PodSucceeded)
		expectPhase(ns, "web-7", buildlockv1.PhaseReleased)
	})
})
