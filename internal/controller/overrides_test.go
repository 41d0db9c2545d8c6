package controller_test

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// apiServerOfItsOwn starts a kube-apiserver and etcd for the calling
// container of specs alone (stopped after it), with the BuildLock CRD and
// the given options, and returns a connection to it and a client.
func apiServerOfItsOwn(opts ...testenv.Option) (*rest.Config, client.Client) {
	GinkgoHelper()
	env, err := testenv.New(opts...)
	Expect(err).NotTo(HaveOccurred())
	c, err := env.Start()
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(env.Stop)
	admin, err := client.New(c, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	return c, admin
}

// Issue 31, breaks 10 and the override hold's message: a person's
// override of a freeze is recorded where it outlives its claim, and its
// holder is told once until when it holds.
var _ = Describe("A person's override of a freeze", func() {
	It("is recorded in the grant record's audit, which outlives the claim, and its hold says until when once", func() {
		ns := newNamespace()
		person := identity{user: "alice@example.com"}
		grantAll(ns, person.user)
		startScopedManager(testenv.ManagerOptions{}, ns)
		setWindows(ns, "", oneOff(buildlockv1.WindowDeny, "holiday", "holiday freeze", time.Now().Add(-time.Minute), time.Now().Add(time.Hour)))
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, expiresAfter: 10 * time.Minute})
		expectFrozen(ns, "shop-41")

		Expect(override(person.client(), ns, "shop-41", "hotfix for incident 4711", time.Now().Add(30*time.Minute))).To(Succeed())
		held := expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		Expect(held.Status.Message).To(ContainSubstring(`overridden by "alice@example.com" ("hotfix for incident 4711")`))
		Expect(held.Status.Message).To(ContainSubstring("holiday freeze"))
		Expect(strings.Count(held.Status.Message, "until")).To(Equal(1), "one deadline, unambiguous: %q", held.Status.Message)
		Expect(held.Status.Message).To(ContainSubstring("until " + held.Status.ExpiresAt.UTC().Format(time.RFC3339)))

		Expect(k8sClient.Delete(ctx, held)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(getLease(g, ns, "staging").Spec.HolderIdentity).To(BeNil())
		}).Should(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(auditOf(g, ns)).To(ContainElement(SatisfyAll(
				HaveField("Kind", buildlockv1.AuditOverride),
				HaveField("Name", "shop-41"),
				HaveField("Build", int64(41)),
				HaveField("Token", held.Status.FencingToken),
				HaveField("By", person.user),
				HaveField("Reason", "Frozen: hotfix for incident 4711"),
			)))
		}).Should(Succeed())
	})
})

// Issue 31, break 4: where nothing verifies who set an override (a cluster
// without the buildlock-override admission policies), a pipeline's
// override of its own claim is ignored, whatever stamp it writes, and the
// claim says why. These specs run against an API server of their own,
// without the enforcement policies.
var _ = Describe("An override nothing verified", Ordered, func() {
	const ci = "ci"
	var (
		cfg2     *rest.Config
		admin    client.Client
		pipeline = "system:serviceaccount:" + ci + ":pipeline"
	)
	BeforeAll(func() {
		cfg2, admin = apiServerOfItsOwn(testenv.WithoutIdentityPolicies())
		Expect(admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ci}})).To(Succeed())
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ci, Name: "pipeline"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{buildlockv1.GroupVersion.Group}, Resources: []string{"buildlocks"},
				Verbs: []string{"create", "get", "list", "watch", "patch", "update", "delete"}}}}
		Expect(admin.Create(ctx, role)).To(Succeed())
		Expect(admin.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ci, Name: "pipeline"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pipeline"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: pipeline}},
		})).To(Succeed())
		mgr, err := testenv.StartManager(ctx, cfg2, testenv.ManagerOptions{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(mgr.Stop)
	})

	It("does not let a pipeline through its freeze, and the claim says why", func() {
		p := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ci, Name: "web"}}
		p.Spec.Windows = []buildlockv1.Window{oneOff(buildlockv1.WindowDeny, "freeze", "release freeze", time.Now().Add(-time.Minute), time.Now().Add(time.Hour))}
		Expect(admin.Create(ctx, p)).To(Succeed())
		own, err := client.New(identity{user: pipeline}.configOn(cfg2), client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())
		Expect(own.Create(ctx, newClaim(ci, "web-42", claimOpts{target: "web", repo: "acme/web", build: 42, expiresAfter: 10 * time.Minute}))).To(Succeed())
		claim := func(g Gomega) *buildlockv1.BuildLock {
			var bl buildlockv1.BuildLock
			g.Expect(admin.Get(ctx, types.NamespacedName{Namespace: ci, Name: "web-42"}, &bl)).To(Succeed())
			return &bl
		}
		Eventually(func(g Gomega) { g.Expect(claim(g).Status.Reason).To(Equal(buildlockv1.ReasonFrozen)) }).Should(Succeed())

		By("the pipeline's own service account annotates its claim, stamp and all")
		Expect(own.Patch(ctx, claim(Default), mergePatch(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
			buildlockv1.OverrideAnnotation:        "hotfix",
			buildlockv1.OverrideExpiresAnnotation: time.Now().Add(20 * time.Minute).UTC().Format(time.RFC3339),
			buildlockv1.OverriddenByAnnotation:    "alice@example.com",
		}}}))).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(claim(g).Status.Message).To(ContainSubstring("does not apply: nothing verified who set it"))
		}).Should(Succeed())
		Consistently(func(g Gomega) {
			bl := claim(g)
			g.Expect(bl.Status.Phase).To(Equal(buildlockv1.PhaseWaiting), "message %q", bl.Status.Message)
			g.Expect(bl.Status.Reason).To(Equal(buildlockv1.ReasonFrozen))
			g.Expect(bl.Status.Message).To(ContainSubstring("does not apply: nothing verified who set it"))
		}, "2s").Should(Succeed())
	})
})
