package controller_test

import (
	"context"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// leaseCreates counts the Lease creates a manager's client sends, by
// namespace, whatever the API server answers.
type leaseCreates struct {
	mu    sync.Mutex
	count map[string]int
}

func (l *leaseCreates) funcs() interceptor.Funcs {
	return interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
		if _, ok := obj.(*coordinationv1.Lease); ok {
			l.mu.Lock()
			l.count[obj.GetNamespace()]++
			l.mu.Unlock()
		}
		return c.Create(ctx, obj, opts...)
	}}
}

// getPolicyOf reads the BuildLockPolicy of target in ns.
func getPolicyOf(g Gomega, ns, target string) *buildlockv1.BuildLockPolicy {
	var p buildlockv1.BuildLockPolicy
	g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: target}, &p)).To(Succeed())
	return &p
}

func (l *leaseCreates) in(ns string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.count[ns]
}

// Issue 31, break 3: a Lease of somebody else's under an enforced lock's
// grant Lease name. The operator never takes it over, sends no write in a
// loop, and both the policy and the claims say which Lease is in the way
// and what to do.
var _ = Describe("An enforced lock whose grant Lease name a Lease of somebody else's takes", func() {
	It("backs off, says so on the policy's Enforced condition and the claims, and enforces once that Lease is gone", func() {
		ci := newNamespace()
		target := "prd-" + ci[len("bl-"):]
		namespaceNamed(target, map[string]string{buildlockv1.LockedByLabel: ci})
		theirs := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: ci, Name: buildlockv1.GrantLeaseName(target)},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("deploy-bot"), LeaseTransitions: ptr.To(int32(1))},
		}
		Expect(k8sClient.Create(ctx, theirs)).To(Succeed())

		creates := &leaseCreates{count: map[string]int{}}
		startScopedManager(testenv.ManagerOptions{NewClient: testenv.InterceptClient(creates.funcs())}, ci)
		policy := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ci, Name: target}}
		policy.Spec.Enforce = &buildlockv1.Enforcement{ServiceAccounts: []string{"pipeline"}}
		Expect(k8sClient.Create(ctx, policy)).To(Succeed())

		enforced := func(g Gomega) *metav1.Condition {
			c := meta.FindStatusCondition(getPolicyOf(g, ci, target).Status.Conditions, buildlockv1.ConditionEnforced)
			g.Expect(c).NotTo(BeNil())
			return c
		}
		Eventually(func(g Gomega) {
			g.Expect(meta.IsStatusConditionTrue(getPolicyOf(g, ci, target).Status.Conditions, buildlockv1.ConditionReady)).To(BeTrue())
		}).Should(Succeed())
		By("no hot loop: at most one Lease create in three seconds")
		before := creates.in(ci)
		time.Sleep(3 * time.Second)
		Expect(creates.in(ci)-before).To(BeNumerically("<=", 1), "the manager retried the create of a Lease that exists")

		Eventually(func(g Gomega) {
			c := enforced(g)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(buildlockv1.ReasonForeignLease), "message %q", c.Message)
			g.Expect(c.Message).To(ContainSubstring("Lease " + ci + "/" + theirs.Name + " exists but was not created by buildlock"))
			g.Expect(c.Message).To(ContainSubstring("Delete that Lease"))
		}).Should(Succeed())

		By("a claim stays Pending and names the Lease")
		createClaim(ci, "shop-41", claimOpts{target: target, repo: "acme/shop", build: 41, pod: "shop-41"})
		Eventually(func(g Gomega) {
			bl := getClaim(g, ci, "shop-41")
			g.Expect(bl.Status.Phase).To(Equal(buildlockv1.PhasePending))
			g.Expect(bl.Status.Reason).To(Equal(buildlockv1.ReasonForeignLease))
			g.Expect(bl.Status.Message).To(ContainSubstring("Lease " + ci + "/" + theirs.Name + " exists but was not created by buildlock"))
		}).Should(Succeed())
		before = creates.in(ci)
		Consistently(func(g Gomega) {
			lease := getLease(g, ci, target)
			g.Expect(lease.Spec.HolderIdentity).To(HaveValue(Equal("deploy-bot")), "never taken over")
			g.Expect(lease.Labels).NotTo(HaveKey("app.kubernetes.io/managed-by"))
		}, "2s").Should(Succeed())
		Expect(creates.in(ci)-before).To(BeNumerically("<=", 1), "no hot loop once a claim waits")

		By("once that Lease is gone, the lock is granted and the target fenced")
		Expect(k8sClient.Delete(ctx, theirs)).To(Succeed())
		poke(ci, "shop-41")
		expectPhase(ci, "shop-41", buildlockv1.PhaseHeld)
		Eventually(func(g Gomega) {
			g.Expect(enforced(g).Reason).To(Equal(buildlockv1.ReasonEnforcing))
		}).Should(Succeed())
	})
})
