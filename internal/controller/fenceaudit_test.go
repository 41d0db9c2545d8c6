package controller_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// editRules are the rules of the built-in edit ClusterRole that matter
// here (the test API server runs no controller that aggregates it): it may
// impersonate the namespace's service accounts, create their tokens, and
// write its workloads and their configuration.
var editRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"serviceaccounts"}, Verbs: []string{"impersonate"}},
	{APIGroups: []string{""}, Resources: []string{"serviceaccounts/token"}, Verbs: []string{"create"}},
	{APIGroups: []string{""}, Resources: []string{"pods", "configmaps", "secrets", "services", "serviceaccounts"},
		Verbs: []string{"create", "delete", "deletecollection", "patch", "update"}},
	{APIGroups: []string{"apps"}, Resources: []string{"deployments", "replicasets", "statefulsets", "daemonsets"},
		Verbs: []string{"create", "delete", "deletecollection", "patch", "update"}},
	{APIGroups: []string{"batch"}, Resources: []string{"jobs", "cronjobs"}, Verbs: []string{"create", "delete", "deletecollection", "patch", "update"}},
}

// bindRole binds the Role role of namespace in to subjects.
func bindRole(in, role string, subjects ...rbacv1.Subject) {
	GinkgoHelper()
	Expect(k8sClient.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: in, GenerateName: role + "-"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role},
		Subjects:   subjects,
	})).To(Succeed())
}

// serviceAccountSubject is the RBAC subject of service account ns/name.
func serviceAccountSubject(ns, name string) rbacv1.Subject {
	return rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: name}
}

// Issue 31, break 7: a pipeline whose Role grants impersonate on service
// accounts in the target (the built-in edit and admin roles do) writes into
// the enforced target as another service account without holding the lock:
// admission sees only the impersonated user. It may also mint tokens of the
// target's service accounts, and leave workloads behind that write as them.
// Admission cannot tell (Kubernetes 1.37 gives it no trace of the
// impersonator), so the policy controller audits the fence and says so.
var _ = Describe("The fence's self-audit", Ordered, func() {
	var (
		ci, target           string
		pipeline, narrow     string
		policy               *buildlockv1.BuildLockPolicy
		deployer, deployerSA string
	)

	bypassable := func(g Gomega) (*metav1.Condition, []buildlockv1.FenceBypass) {
		var p buildlockv1.BuildLockPolicy
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(policy), &p)).To(Succeed())
		c := meta.FindStatusCondition(p.Status.Conditions, buildlockv1.ConditionBypassable)
		g.Expect(c).NotTo(BeNil(), "the policy's status has no Bypassable condition")
		return c, p.Status.Bypasses
	}

	BeforeAll(func() {
		ci = newNamespace()
		target = "audit-" + ci[len("bl-"):]
		namespaceNamed(target, map[string]string{buildlockv1.LockedByLabel: ci})
		pipeline = "system:serviceaccount:" + ci + ":pipeline"
		narrow = "system:serviceaccount:" + ci + ":narrow"
		for _, name := range []string{"pipeline", "narrow"} {
			Expect(k8sClient.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ci, Name: name}})).To(Succeed())
		}
		// The target's deploy account, which may write there: what a
		// workload runs as, and whom the pipeline impersonates.
		deployer = "deploy-sa"
		deployerSA = "system:serviceaccount:" + target + ":" + deployer
		Expect(k8sClient.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: target, Name: deployer}})).To(Succeed())
		Expect(k8sClient.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: target, Name: "edit"}, Rules: editRules})).To(Succeed())
		bindRole(target, "edit", serviceAccountSubject(target, deployer))
		// The pipeline deploys with the rights of the built-in edit role in
		// the target; the narrow one may only write ConfigMaps there.
		bindRole(target, "edit", serviceAccountSubject(ci, "pipeline"))
		Expect(k8sClient.Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Namespace: target, Name: "configmaps"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create", "update", "patch"}}},
		})).To(Succeed())
		Expect(k8sClient.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: target, Name: "narrow"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "configmaps"},
			Subjects:   []rbacv1.Subject{serviceAccountSubject(ci, "narrow")},
		})).To(Succeed())

		startScopedManager(testenv.ManagerOptions{}, ci)
		policy = &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ci, Name: target}}
		policy.Spec.Enforce = &buildlockv1.Enforcement{ServiceAccounts: []string{"pipeline", "narrow"}}
		Expect(k8sClient.Create(ctx, policy)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(policy), policy)).To(Succeed())
			g.Expect(meta.FindStatusCondition(policy.Status.Conditions, buildlockv1.ConditionEnforced)).
				To(HaveValue(HaveField("Reason", buildlockv1.ReasonEnforcing)))
		}).Should(Succeed())
	})

	It("is needed: a fenced pipeline with edit writes into the target as the target's account, holding nothing", func() {
		Eventually(func() error { return deploy(identity{user: pipeline}, target, "as-itself") }).
			Should(beRefusedWith("nobody holds the lock"), "the pipeline itself is fenced")
		// The pipeline's own token, impersonating the target's account:
		// admission sees deploy-sa only.
		asPipelineAsDeployer, err := client.New(impersonatingWithToken(ci, "pipeline", deployerSA), client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: target, Name: "around-the-fence"}}
		Expect(asPipelineAsDeployer.Create(ctx, cm)).To(Succeed(), "admission cannot tell who impersonates deploy-sa")
	})

	It("names the pipeline that may impersonate, mint tokens and leave workloads behind, and says how to close it", func() {
		Eventually(func(g Gomega) {
			c, bypasses := bypassable(g)
			g.Expect(c.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(c.Reason).To(Equal(buildlockv1.ReasonImpersonation))
			g.Expect(c.Message).To(And(ContainSubstring(pipeline), ContainSubstring("impersonate"), ContainSubstring("Close it")))
			g.Expect(c.Message).NotTo(ContainSubstring(narrow))
			g.Expect(bypasses).To(ConsistOf(buildlockv1.FenceBypass{Identity: pipeline, Rights: []buildlockv1.BypassRight{
				buildlockv1.BypassImpersonate, buildlockv1.BypassServiceAccountTokens, buildlockv1.BypassWorkloads}}))
		}).Should(Succeed())
	})

	It("clears once the pipeline's rights are narrowed, at the next audit", func() {
		var bindings rbacv1.RoleBindingList
		Expect(k8sClient.List(ctx, &bindings, client.InNamespace(target))).To(Succeed())
		for _, b := range bindings.Items {
			if b.RoleRef.Name == "edit" && b.Subjects[0].Namespace == ci {
				Expect(k8sClient.Delete(ctx, &b)).To(Succeed())
			}
		}
		Expect(k8sClient.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: target, Name: "pipeline-narrow"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "configmaps"},
			Subjects:   []rbacv1.Subject{serviceAccountSubject(ci, "pipeline")},
		})).To(Succeed())
		// RBAC is not watched: a change of the policy audits it again at
		// once (otherwise within ten minutes).
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(policy), policy)).To(Succeed())
		policy.Spec.MaxHold = &metav1.Duration{Duration: 2 * time.Hour}
		Expect(k8sClient.Update(ctx, policy)).To(Succeed())
		Eventually(func(g Gomega) {
			c, bypasses := bypassable(g)
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(buildlockv1.ReasonNoBypass))
			g.Expect(c.Message).To(ContainSubstring("None of the 2 fenced pipeline identities"))
			g.Expect(bypasses).To(BeEmpty())
		}).Should(Succeed())
	})

	It("is gone with the policy's enforcement", func() {
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(policy), policy)).To(Succeed())
		policy.Spec.Enforce = nil
		Expect(k8sClient.Update(ctx, policy)).To(Succeed())
		Eventually(func(g Gomega) {
			var p buildlockv1.BuildLockPolicy
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(policy), &p)).To(Succeed())
			g.Expect(meta.FindStatusCondition(p.Status.Conditions, buildlockv1.ConditionBypassable)).To(BeNil())
			g.Expect(p.Status.Bypasses).To(BeEmpty())
		}).Should(Succeed())
	})
})

// impersonatingWithToken is a connection with a real token of service
// account ns/name, authenticated by the API server itself, that
// impersonates the user as: admission sees a request of as.
func impersonatingWithToken(ns, name, as string) *rest.Config {
	GinkgoHelper()
	c := tokenConfig(ns, name)
	c.Impersonate = rest.ImpersonationConfig{UserName: as}
	return c
}
