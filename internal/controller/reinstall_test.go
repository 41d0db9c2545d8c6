package controller_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// Issue 21, items 10 and 12. These specs remove admission policies and can
// stop the API server's Lease informer for good, so they run against an API
// server of their own.
var _ = Describe("Re-installing the enforcement policies", Ordered, func() {
	const ci, target = "ci", "staging"
	var (
		cfg2     *rest.Config
		admin    client.Client
		registry *prometheus.Registry
		pipeline = "system:serviceaccount:" + ci + ":pipeline"
		pods     = map[string]*corev1.Pod{}
		// token is the first grant's on target: the fence names it and
		// the next ones.
		token int64
	)
	as := func(pod string) identity { return identity{user: pipeline, pod: pods[pod]} }
	clientOf := func(id identity) client.Client {
		GinkgoHelper()
		c, err := client.New(id.configOn(cfg2), client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())
		return c
	}
	deployAs := func(pod string) error {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: target, Name: fmt.Sprintf("%s-%d", pod, time.Now().UnixNano())}}
		return clientOf(as(pod)).Create(ctx, cm)
	}
	claim := func(pod, repo string, build int64) {
		GinkgoHelper()
		bl := newClaim(ci, pod, claimOpts{target: target, repo: repo, build: build})
		bl.Spec.PodRef = &buildlockv1.PodReference{Name: pod, UID: string(pods[pod].UID)}
		Expect(clientOf(as(pod)).Create(ctx, bl)).To(Succeed())
	}
	phaseOf := func(name string) func(g Gomega) buildlockv1.Phase {
		return func(g Gomega) buildlockv1.Phase {
			var bl buildlockv1.BuildLock
			g.Expect(admin.Get(ctx, types.NamespacedName{Namespace: ci, Name: name}, &bl)).To(Succeed())
			return bl.Status.Phase
		}
	}
	finish := func(pod string) {
		GinkgoHelper()
		p := pods[pod].DeepCopy()
		p.Status.Phase = corev1.PodSucceeded
		Expect(admin.Status().Update(ctx, p)).To(Succeed())
	}
	enforced := func(g Gomega) *metav1.Condition {
		var p buildlockv1.BuildLockPolicy
		g.Expect(admin.Get(ctx, types.NamespacedName{Namespace: ci, Name: target}, &p)).To(Succeed())
		c := meta.FindStatusCondition(p.Status.Conditions, buildlockv1.ConditionEnforced)
		g.Expect(c).NotTo(BeNil())
		return c
	}
	// removeAndWait removes the given directories of config/, in that
	// order, and waits until the API server has noticed the last one's
	// buildlock-enforce gone: a waiter's write is admitted.
	removeAndWait := func(waiter string, dirs ...string) {
		GinkgoHelper()
		Expect(testenv.DeleteConfig(ctx, cfg2, dirs...)).To(Succeed())
		Eventually(func() error { return deployAs(waiter) }).Should(Succeed())
	}

	BeforeAll(func() {
		// As a cluster that never had them: not even the identity policies
		// every installation has.
		cfg2, admin = apiServerOfItsOwn(testenv.WithoutIdentityPolicies())
		for _, ns := range []*corev1.Namespace{
			{ObjectMeta: metav1.ObjectMeta{Name: ci}},
			{ObjectMeta: metav1.ObjectMeta{Name: target, Labels: map[string]string{buildlockv1.LockedByLabel: ci}}},
		} {
			Expect(admin.Create(ctx, ns)).To(Succeed())
			role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "all"},
				Rules: []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}}}}
			Expect(admin.Create(ctx, role)).To(Succeed())
			Expect(admin.Create(ctx, &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "pipeline"},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "all"},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: pipeline}},
			})).To(Succeed())
		}
		for _, name := range []string{"shop-41", "web-7", "api-3", "docs-2"} {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ci, Name: name},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "build", Image: "busybox"}}}}
			Expect(admin.Create(ctx, pod)).To(Succeed())
			pods[name] = pod
		}
		registry = prometheus.NewRegistry()
		mgr, err := testenv.StartManager(ctx, cfg2, testenv.ManagerOptions{Registry: registry})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(mgr.Stop)
	})

	It("calls a force-release unverified while enforcement's policies are not installed, whatever the stamp says", func() {
		bl := newClaim(ci, "ops-1", claimOpts{target: "unfenced", repo: "acme/ops", build: 1})
		Expect(admin.Create(ctx, bl)).To(Succeed())
		Eventually(phaseOf("ops-1")).Should(Equal(buildlockv1.PhaseHeld))
		Expect(admin.Patch(ctx, bl, mergePatch(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
			buildlockv1.ForceReleaseAnnotation: "alice@corp: maintenance", buildlockv1.ForceReleasedByAnnotation: "alice@corp",
		}}}))).To(Succeed())
		Eventually(phaseOf("ops-1")).Should(Equal(buildlockv1.PhaseReleased))
		Expect(admin.Get(ctx, client.ObjectKeyFromObject(bl), bl)).To(Succeed())
		Expect(bl.Status.Message).To(ContainSubstring(`force-released by an unverified requester ("alice@corp: maintenance")`))
	})

	// Issue 31: the identity policies are part of every installation, and
	// where the API server lacks them the operator says so.
	It("says on each policy and in a metric which identity policies the API server lacks, until it has them", func() {
		identityPolicies := []string{"buildlock-claim-identity", "buildlock-consent", "buildlock-force-release", "buildlock-freezes",
			"buildlock-grant-leases", "buildlock-override", "buildlock-requester"}
		policy := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ci, Name: "unfenced"}}
		Expect(admin.Create(ctx, policy)).To(Succeed())
		verified := func(g Gomega) *metav1.Condition {
			var p buildlockv1.BuildLockPolicy
			g.Expect(admin.Get(ctx, client.ObjectKeyFromObject(policy), &p)).To(Succeed())
			c := meta.FindStatusCondition(p.Status.Conditions, buildlockv1.ConditionIdentityVerified)
			g.Expect(c).NotTo(BeNil(), "the policy has no IdentityVerified condition")
			return c
		}
		Eventually(func(g Gomega) {
			c := verified(g)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(buildlockv1.ReasonIdentityPoliciesMissing))
			for _, name := range identityPolicies {
				g.Expect(c.Message).To(ContainSubstring(name))
			}
			g.Expect(c.Message).To(ContainSubstring("fails closed"))
		}).Should(Succeed())
		for _, name := range identityPolicies {
			Expect(series(registry, "buildlock_identity_policy_installed", "policy", name)).To(HaveValue(Equal(0.0)), name)
		}

		By("installing them, as every installation does")
		Expect(testenv.InstallIdentity(ctx, cfg2)).To(Succeed())
		Eventually(func(g Gomega) {
			c := verified(g)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(c.Reason).To(Equal(buildlockv1.ReasonIdentityPoliciesInstalled))
		}).Should(Succeed())
		for _, name := range identityPolicies {
			Expect(series(registry, "buildlock_identity_policy_installed", "policy", name)).To(HaveValue(Equal(1.0)), name)
		}
	})

	It("keeps the fence moving with the grant after the policies are removed and installed again", func() {
		Expect(testenv.InstallEnforcement(ctx, cfg2)).To(Succeed())
		policy := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ci, Name: target}}
		policy.Spec.Enforce = &buildlockv1.Enforcement{ServiceAccounts: []string{"pipeline"}}
		Expect(admin.Create(ctx, policy)).To(Succeed())
		claim("shop-41", "acme/shop", 41)
		Eventually(phaseOf("shop-41")).Should(Equal(buildlockv1.PhaseHeld))
		claim("web-7", "acme/web", 7)
		Eventually(phaseOf("web-7")).Should(Equal(buildlockv1.PhaseWaiting))
		Eventually(func(g Gomega) string { return enforced(g).Reason }).Should(Equal(buildlockv1.ReasonEnforcing))
		// The Lease was created while the lock had none: its grants start
		// above the namespace's token floor.
		var first buildlockv1.BuildLock
		Expect(admin.Get(ctx, types.NamespacedName{Namespace: ci, Name: "shop-41"}, &first)).To(Succeed())
		token = first.Status.FencingToken
		Eventually(func() error { return deployAs("web-7") }).Should(beRefusedWith(fmt.Sprintf("held by BuildLock ci/shop-41 (fencing token %d)", token)))

		By("config/enforcement is removed and applied again (config/lease-informer stays)")
		removeAndWait("web-7", testenv.EnforcementDir)
		Expect(testenv.InstallEnforcement(ctx, cfg2)).To(Succeed())
		Eventually(func(g Gomega) string { return enforced(g).Reason }).Should(Equal(buildlockv1.ReasonEnforcing))

		By("the next hand-off moves the fence")
		finish("shop-41")
		Eventually(phaseOf("web-7")).Should(Equal(buildlockv1.PhaseHeld))
		Eventually(func() error { return deployAs("web-7") }).Should(Succeed(), "the new holder")
		Eventually(func() error { return deployAs("shop-41") }).Should(beRefusedWith(fmt.Sprintf("held by BuildLock ci/web-7 (fencing token %d)", token+1)))
		claim("api-3", "acme/api", 3)
		Eventually(phaseOf("api-3")).Should(Equal(buildlockv1.PhaseWaiting))
		var holder buildlockv1.BuildLock
		Expect(admin.Get(ctx, types.NamespacedName{Namespace: ci, Name: "web-7"}, &holder)).To(Succeed())
		Expect(clientOf(as("api-3")).Delete(ctx, &holder)).To(MatchError(ContainSubstring("only the BuildLocks it created")),
			"the claims are still protected")
	})

	It("reports a frozen fence on the Enforced condition and in a metric", func() {
		By("removing the Lease informer's keep-alive too stops the API server's informer for good")
		// The keep-alive first: once a waiter's write is admitted, the API
		// server has refreshed its policies with neither left.
		removeAndWait("api-3", testenv.LeaseInformerDir, testenv.EnforcementDir)
		Expect(testenv.InstallEnforcement(ctx, cfg2)).To(Succeed())
		finish("web-7")
		Eventually(phaseOf("api-3")).Should(Equal(buildlockv1.PhaseHeld))
		Eventually(func(g Gomega) {
			c := enforced(g)
			g.Expect(c.Reason).To(Equal(buildlockv1.ReasonFenceFrozen))
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Message).To(SatisfyAll(ContainSubstring(fmt.Sprintf("fencing token %d", token+1)), ContainSubstring(fmt.Sprintf("fencing token %d", token+2)),
				ContainSubstring("Restart every kube-apiserver")))
		}).WithTimeout(30 * time.Second).Should(Succeed())
		Expect(deployAs("api-3")).To(beRefusedWith(fmt.Sprintf("held by BuildLock ci/web-7 (fencing token %d)", token+1)), "what the condition reports")
		Expect(gauge(registry, "buildlock_enforced_locks", "reason", buildlockv1.ReasonFenceFrozen)).To(Equal(1.0))
	})
})

// series reads the value of a gauge with the given label from reg; nil
// when there is no such series.
func series(reg prometheus.Gatherer, name, label, value string) *float64 {
	GinkgoHelper()
	families, err := reg.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					v := m.GetGauge().GetValue()
					return &v
				}
			}
		}
	}
	return nil
}

// gauge reads the value of a gauge with the given label from reg (0 when
// there is no such series).
func gauge(reg prometheus.Gatherer, name, label, value string) float64 {
	GinkgoHelper()
	families, err := reg.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}
