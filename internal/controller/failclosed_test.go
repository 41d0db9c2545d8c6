package controller_test

import (
	"encoding/json"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// operatorUser is the operator's identity as config/enforcement names it.
const operatorUser = "system:serviceaccount:buildlock-system:buildlock"

// mergePatch is a JSON merge patch of v.
func mergePatch(v any) client.Patch {
	GinkgoHelper()
	data, err := json.Marshal(v)
	Expect(err).NotTo(HaveOccurred())
	return client.RawPatch(types.MergePatchType, data)
}

// labelPatch sets (or, with value nil, removes) one label.
func labelPatch(key string, value *string) client.Patch {
	return mergePatch(map[string]any{"metadata": map[string]any{"labels": map[string]any{key: value}}})
}

// namespaceRef is a namespace to patch by name.
func namespaceRef(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// tokenConfig is a connection with a real token of service account ns/name
// (created if needed), not bound to a pod: authenticated by the API
// server itself, not impersonated.
func tokenConfig(ns, name string) *rest.Config {
	GinkgoHelper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	Expect(client.IgnoreAlreadyExists(k8sClient.Create(ctx, sa))).To(Succeed())
	clientset, err := kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	tr, err := clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(600))},
	}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	c := rest.AnonymousClientConfig(cfg)
	c.BearerToken = tr.Status.Token
	return c
}

// may asks the API server whether c's identity may do a.
func may(c client.Client, a authorizationv1.ResourceAttributes) bool {
	GinkgoHelper()
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &a}}
	Expect(c.Create(ctx, review)).To(Succeed())
	return review.Status.Allowed
}

var _ = Describe("Enforcement that fails closed", Ordered, func() {
	var (
		ci, target, other string
		pipeline          string // the enforced pipeline service account's user name
		otherPipeline     string // a pipeline of another namespace
		shop, web         *corev1.Pod
		person            = identity{user: "alice"}
		operator          *testenv.Manager
	)

	enforcedReason := func(g Gomega, ns, name string) string {
		var p buildlockv1.BuildLockPolicy
		g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &p)).To(Succeed())
		c := meta.FindStatusCondition(p.Status.Conditions, buildlockv1.ConditionEnforced)
		g.Expect(c).NotTo(BeNil())
		return c.Reason
	}
	enforce := func(ns, target string) {
		GinkgoHelper()
		policy := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: target}}
		policy.Spec.Enforce = &buildlockv1.Enforcement{ServiceAccounts: []string{"pipeline"}}
		Expect(k8sClient.Create(ctx, policy)).To(Succeed())
	}
	claimAs := func(pod *corev1.Pod, name, repo string, build int64) {
		GinkgoHelper()
		bl := newClaim(ci, name, claimOpts{target: target, repo: repo, build: build})
		bl.Spec.PodRef = &buildlockv1.PodReference{Name: pod.Name, UID: string(pod.UID)}
		Expect(identity{user: pipeline, pod: pod}.client().Create(ctx, bl)).To(Succeed())
	}

	// expectFenced waits until the waiter's write into the target is
	// refused: what a spec that expects a write to be admitted starts from.
	expectFenced := func() {
		GinkgoHelper()
		Eventually(func() error {
			return deploy(identity{user: pipeline, pod: web}, target, fmt.Sprintf("fenced-%d", time.Now().UnixNano()))
		}).Should(beRefusedWith("held by BuildLock"), "the waiter is fenced out of the target")
	}

	BeforeAll(func() {
		ci = newNamespace()
		target = "fc-" + ci[len("bl-"):]
		other = newNamespace()
		namespaceNamed(target, map[string]string{buildlockv1.LockedByLabel: ci})
		pipeline = "system:serviceaccount:" + ci + ":pipeline"
		otherPipeline = "system:serviceaccount:" + other + ":pipeline"
		for _, ns := range []string{ci, target} {
			grantAll(ns, pipeline)
			grantAll(ns, person.user)
			grantAll(ns, otherPipeline)
		}
		shop, web = createPod(ci, "shop-41"), createPod(ci, "web-7")
		createPod(target, "app")

		operator = startScopedManager(testenv.ManagerOptions{}, ci, other)
		enforce(ci, target)
		Eventually(func(g Gomega) string { return enforcedReason(g, ci, target) }).Should(Equal(buildlockv1.ReasonEnforcing))
		claimAs(shop, "shop-41", "acme/shop", 41)
		expectPhase(ci, "shop-41", buildlockv1.PhaseHeld)
		claimAs(web, "web-7", "acme/web", 7)
		expectPhase(ci, "web-7", buildlockv1.PhaseWaiting)
		Eventually(func() error { return deploy(identity{user: pipeline, pod: shop}, target, "from-holder") }).Should(Succeed())
	})

	// Issue 21, item 11.
	It("says Enforcing only once the API server refuses a pipeline's write", func() {
		fresh := "fc2-" + ci[len("bl-"):]
		namespaceNamed(fresh, map[string]string{buildlockv1.LockedByLabel: ci})
		grantAll(fresh, pipeline)
		enforce(ci, fresh)
		Eventually(func(g Gomega) string { return enforcedReason(g, ci, fresh) }).WithPolling(time.Millisecond).
			Should(Equal(buildlockv1.ReasonEnforcing))
		Expect(deploy(identity{user: pipeline, pod: web}, fresh, "right-after-enforcing")).To(beRefusedWith("nobody holds the lock"),
			"the first write after the condition says Enforcing")
	})

	// Issue 21, item 11: the probe's identity.
	It("lets nobody but the operator act as the probe, and the probe do nothing but create Leases", func() {
		By("a pipeline's own token cannot impersonate the probe")
		asPipeline := tokenConfig(ci, "pipeline")
		asPipeline.Impersonate = rest.ImpersonationConfig{UserName: buildlockv1.EnforcementProbeUser}
		c, err := client.New(asPipeline, client.Options{Scheme: scheme, Mapper: k8sClient.RESTMapper()})
		Expect(err).NotTo(HaveOccurred())
		Expect(c.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: target, GenerateName: "x-"}}, client.DryRunAll)).
			To(beRefusedWith("cannot impersonate"))

		By("the probe may create Leases and nothing else")
		probe := identity{user: buildlockv1.EnforcementProbeUser}.client()
		Expect(may(probe, authorizationv1.ResourceAttributes{Verb: "create", Group: "coordination.k8s.io", Resource: "leases", Namespace: target})).To(BeTrue())
		for _, a := range []authorizationv1.ResourceAttributes{
			{Verb: "create", Resource: "configmaps", Namespace: target},
			{Verb: "get", Resource: "secrets", Namespace: target},
			{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: ci},
			{Verb: "delete", Group: "coordination.k8s.io", Resource: "leases", Namespace: ci},
			{Verb: "patch", Resource: "namespaces", Name: target},
			{Verb: "create", Group: "buildlock.io", Resource: "buildlocks", Namespace: ci},
			{Verb: "impersonate", Resource: "users", Name: "alice"},
		} {
			Expect(may(probe, a)).To(BeFalse(), "the probe must not %s %s", a.Verb, a.Resource)
		}

		By("the probe never holds: even a real write of it into the target is refused")
		Expect(probe.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: target, GenerateName: "x-"}})).
			To(beRefusedWith("buildlock-probe;token=1;holder=shop-41/" + string(getClaim(Default, ci, "shop-41").UID)))
	})

	// Issue 21, item 3.
	It("refuses every change of the consent label by a pipeline identity, and leaves it to people", func() {
		unconsenting := "fc3-" + ci[len("bl-"):]
		namespaceNamed(unconsenting, nil)
		grantAll(unconsenting, pipeline)
		grantAll(unconsenting, person.user)
		for name, tc := range map[string]struct {
			id    identity
			ns    string
			value *string
		}{
			"the waiter removes the label":                     {identity{user: pipeline, pod: web}, target, nil},
			"the holder removes the label":                     {identity{user: pipeline, pod: shop}, target, nil},
			"a pipeline gives the target to another namespace": {identity{user: pipeline, pod: shop}, target, ptr.To(other)},
			"a pipeline of another namespace removes it":       {identity{user: otherPipeline}, target, nil},
			"a pipeline makes a namespace consent":             {identity{user: pipeline, pod: web}, unconsenting, ptr.To(ci)},
		} {
			By(name)
			Expect(tc.id.client().Patch(ctx, namespaceRef(tc.ns), labelPatch(buildlockv1.LockedByLabel, tc.value))).
				To(beRefusedWith("only people give or withdraw a namespace's consent"))
		}
		var ns corev1.Namespace
		Expect(k8sClient.Get(ctx, types.NamespacedName{Name: target}, &ns)).To(Succeed())
		Expect(ns.Labels).To(HaveKeyWithValue(buildlockv1.LockedByLabel, ci))
		Expect(deploy(identity{user: pipeline, pod: web}, target, "after-the-attempts")).To(beRefusedWith("held by BuildLock"))

		By("a non-holder's other change of the target namespace is a write into the target")
		Expect(identity{user: pipeline, pod: web}.client().Patch(ctx, namespaceRef(target), labelPatch("team", ptr.To("web")))).
			To(beRefusedWith("held by BuildLock"))

		By("a person gives and withdraws consent")
		Expect(person.client().Patch(ctx, namespaceRef(unconsenting), labelPatch(buildlockv1.LockedByLabel, ptr.To(ci)))).To(Succeed())
		Expect(person.client().Patch(ctx, namespaceRef(unconsenting), labelPatch(buildlockv1.LockedByLabel, nil))).To(Succeed())
	})

	// Issue 21, item 7.
	It("judges no cluster-scoped write", func() {
		expectFenced()
		grantClusterWide(pipeline, schedulingv1.GroupName, "priorityclasses")
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "fc-" + ci[len("bl-"):]}, Value: 1000}
		Expect(identity{user: pipeline, pod: web}.client().Create(ctx, pc)).To(Succeed(), "a waiter's PriorityClass")
		Expect(k8sClient.Delete(ctx, pc)).To(Succeed())
	})

	// Issue 21, item 16.
	It("admits reads through a proxy and dry runs of non-holders, but fences exec and the probe's dry run", func() {
		expectFenced()
		clientset, err := kubernetes.NewForConfig(identity{user: pipeline, pod: web}.config())
		Expect(err).NotTo(HaveOccurred())
		proxied := clientset.CoreV1().RESTClient().Get().Namespace(target).Resource("pods").Name("app").SubResource("proxy").Do(ctx).Error()
		Expect(proxied).NotTo(MatchError(ContainSubstring("buildlock")), "a GET through pods/proxy is a read (it fails further on: envtest runs no pods)")
		Expect(proxied).To(HaveOccurred())

		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: target, Name: "diff"}}
		Expect(identity{user: pipeline, pod: web}.client().Create(ctx, cm, client.DryRunAll)).To(Succeed(), "kubectl diff of a waiter")
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(cm), &corev1.ConfigMap{})).To(Satisfy(apierrors.IsNotFound), "and nothing was written")

		exec := clientset.CoreV1().RESTClient().Post().Namespace(target).Resource("pods").Name("app").SubResource("exec").
			Param("command", "true").Param("stdout", "true").Do(ctx).Error()
		Expect(exec).To(beRefusedWith("held by BuildLock"), "exec stays fenced")

		probe := identity{user: buildlockv1.EnforcementProbeUser}.client()
		Expect(probe.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: target, GenerateName: "x-"}}, client.DryRunAll)).
			To(beRefusedWith("buildlock-probe;"), "the probe's dry run is judged")
	})

	// Issue 21, item 12.
	It("names who force-released a claim as the API server authenticated them, whatever the annotation says", func() {
		forcer := identity{user: otherPipeline}
		Expect(forcer.client().Patch(ctx, getClaim(Default, ci, "shop-41"), mergePatch(map[string]any{"metadata": map[string]any{
			"annotations": map[string]string{buildlockv1.ForceReleaseAnnotation: "alice@corp: maintenance"}}}))).To(Succeed())
		old := expectPhase(ci, "shop-41", buildlockv1.PhaseReleased)
		Expect(old.Annotations).To(HaveKeyWithValue(buildlockv1.ForceReleasedByAnnotation, otherPipeline))
		verified := fmt.Sprintf(`force-released by %q ("alice@corp: maintenance")`, otherPipeline)
		Expect(old.Status.Message).To(ContainSubstring(verified))
		Eventually(func(g Gomega) {
			var events eventsv1.EventList
			g.Expect(k8sClient.List(ctx, &events, client.InNamespace(ci))).To(Succeed())
			g.Expect(events.Items).To(ContainElement(And(HaveField("Regarding.Name", "shop-41"),
				HaveField("Reason", string(buildlockv1.PhaseReleased)), HaveField("Note", ContainSubstring(verified)))))
		}).Should(Succeed())
		expectPhase(ci, "web-7", buildlockv1.PhaseHeld)

		By("nobody writes the stamp but the API server")
		for name, patch := range map[string]map[string]string{
			"a forged stamp":                     {buildlockv1.ForceReleasedByAnnotation: "alice@corp"},
			"a stamp removed":                    {buildlockv1.ForceReleasedByAnnotation: ""},
			"a person's forged stamp, unchanged": {buildlockv1.ForceReleaseAnnotation: "alice@corp: maintenance", buildlockv1.ForceReleasedByAnnotation: "alice"},
		} {
			By(name)
			Expect(person.client().Patch(ctx, getClaim(Default, ci, "shop-41"), mergePatch(map[string]any{"metadata": map[string]any{"annotations": patch}}))).
				To(MatchError(ContainSubstring("force-released-by is stamped by the API server")))
		}
		Expect(person.client().Patch(ctx, getClaim(Default, ci, "shop-41"), mergePatch(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
			buildlockv1.ForceReleaseAnnotation: "alice: once more", buildlockv1.ForceReleasedByAnnotation: "bob"}}}))).To(Succeed())
		Expect(getClaim(Default, ci, "shop-41").Annotations).To(HaveKeyWithValue(buildlockv1.ForceReleasedByAnnotation, person.user),
			"a stamp sent along with a force-release is replaced by the sender's identity")
	})

	// Issue 21, item 4: only the operator writes the grant Leases.
	It("lets nobody but the operator write the locks' Leases", func() {
		grant := getLease(Default, ci, target)
		asPerson := person.client()
		Expect(asPerson.Delete(ctx, grant.DeepCopy())).To(beRefusedWith("is a lock's record, written by the buildlock operator"))
		edited := grant.DeepCopy()
		edited.Annotations["buildlock.io/writer-pod-uid"] = string(shop.UID)
		Expect(asPerson.Update(ctx, edited)).To(beRefusedWith("is a lock's record"))
		Expect(asPerson.Patch(ctx, grant.DeepCopy(), labelPatch("app.kubernetes.io/managed-by", nil))).To(beRefusedWith("is a lock's record"))
		forged := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ci, Name: buildlockv1.GrantLeaseName("forged"),
			Labels: map[string]string{"app.kubernetes.io/managed-by": "buildlock", "buildlock.io/target": "forged"}}}
		Expect(asPerson.Create(ctx, forged)).To(beRefusedWith("is a lock's record"))
		Expect(identity{user: pipeline, pod: web}.client().Delete(ctx, grant.DeepCopy())).To(HaveOccurred())

		By("the operator's own identity may")
		grantAll(ci, operatorUser)
		asOperator := identity{user: operatorUser}.client()
		Expect(asOperator.Update(ctx, edited.DeepCopy(), client.DryRunAll)).To(Succeed())
		Expect(asOperator.Delete(ctx, grant.DeepCopy(), client.DryRunAll)).To(Succeed())

		By("and anyone may in a namespace that is being deleted")
		doomed := newNamespace()
		grantAll(doomed, person.user)
		record := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: doomed, Name: buildlockv1.GrantLeaseName("staging"),
			Labels: map[string]string{"app.kubernetes.io/managed-by": "buildlock", "buildlock.io/target": "staging"}}}
		Expect(k8sClient.Create(ctx, record)).To(Succeed())
		Expect(asPerson.Delete(ctx, record.DeepCopy())).To(beRefusedWith("is a lock's record"))
		Expect(k8sClient.Delete(ctx, namespaceRef(doomed))).To(Succeed())
		Expect(asPerson.Delete(ctx, record.DeepCopy())).To(Succeed(), "the namespace controller's delete")
	})

	// Issue 31: the refusal of a write for want of the lock's record is the
	// API server's own ("no params found for policy binding with `Deny`
	// parameterNotFoundAction"), which says nothing of the lock; so the
	// record of an enforced lock cannot go missing, not even by the hand of
	// system:masters, and the refusal of its deletion says what to do.
	It("keeps the record of an enforced lock from being deleted, saying what to do instead", func() {
		record := getLease(Default, ci, target)
		Expect(k8sClient.Delete(ctx, record.DeepCopy())).To(beRefusedWith(
			"is the record of the enforced lock of namespace "+target,
			"refuses every write into "+target+", from anyone",
			"kubectl buildlock force-release -n "+ci,
			"remove its label buildlock.io/locked-by"), "system:masters")
		Expect(person.client().Delete(ctx, record.DeepCopy())).To(beRefusedWith("written by the buildlock operator"))
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(record), &coordinationv1.Lease{})).To(Succeed())
		Expect(deploy(person, target, "person-with-record")).To(Succeed(), "the target is as it was")
	})

	// Issue 21, item 4: a missing parameter refuses.
	It("refuses every write into the target while its grant Lease is missing, and keeps the label as break-glass", func() {
		controllerUser := "system:serviceaccount:kube-system:replicaset-controller"
		grantAll(target, controllerUser)
		Expect(operator.Stop()).To(Succeed())
		// Only with the guard's own help: a member of system:masters takes
		// the enforced label off the record first.
		record := getLease(Default, ci, target)
		Expect(k8sClient.Patch(ctx, record, labelPatch("buildlock.io/enforced", nil))).To(Succeed())
		Expect(k8sClient.Delete(ctx, record)).To(Succeed())
		missing := MatchError(ContainSubstring("no params found for policy binding"))
		Eventually(func() error { return deploy(identity{user: pipeline, pod: web}, target, "holder-without-grant") }).
			Should(missing, "the holder's pipeline")
		Expect(deploy(identity{user: pipeline, pod: shop}, target, "waiter-without-grant")).To(missing)
		// What Deny costs: nobody else writes into the target either, the
		// controllers that run its workloads included.
		Expect(deploy(person, target, "person-without-grant")).To(missing)
		Expect(k8sClient.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: target, Name: "admin-without-grant"}})).
			To(missing, "system:masters too")
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: target, Name: "replica"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app"}}}}
		Expect(identity{user: controllerUser}.client().Create(ctx, pod)).To(missing)

		By("a person removes the consent label: the target opens")
		Expect(person.client().Patch(ctx, namespaceRef(target), labelPatch(buildlockv1.LockedByLabel, nil))).To(Succeed())
		Eventually(func() error { return deploy(person, target, fmt.Sprintf("glass-%d", time.Now().UnixNano())) }).Should(Succeed())
		Expect(deploy(identity{user: pipeline, pod: shop}, target, "glass-pipeline")).To(Succeed())
	})
})

// Issue 21, item 8.
var _ = Describe("A target that is its own claims namespace", func() {
	It("can be taken: claims are not fenced there, every other write is", func() {
		self := newNamespace()
		Expect(k8sClient.Patch(ctx, namespaceRef(self), labelPatch(buildlockv1.LockedByLabel, ptr.To(self)))).To(Succeed())
		pipeline := "system:serviceaccount:" + self + ":pipeline"
		grantAll(self, pipeline)
		shop, web := createPod(self, "shop-41"), createPod(self, "web-7")
		startScopedManager(testenv.ManagerOptions{}, self)
		policy := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: self, Name: self}}
		policy.Spec.Enforce = &buildlockv1.Enforcement{ServiceAccounts: []string{"pipeline"}}
		Expect(k8sClient.Create(ctx, policy)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(policy), policy)).To(Succeed())
			g.Expect(meta.FindStatusCondition(policy.Status.Conditions, buildlockv1.ConditionEnforced)).
				To(HaveValue(HaveField("Reason", buildlockv1.ReasonEnforcing)))
		}).Should(Succeed())

		claim := func(pod *corev1.Pod, repo string, build int64) *buildlockv1.BuildLock {
			bl := newClaim(self, pod.Name, claimOpts{target: self, repo: repo, build: build})
			bl.Spec.PodRef = &buildlockv1.PodReference{Name: pod.Name, UID: string(pod.UID)}
			return bl
		}
		Eventually(func() error { return deploy(identity{user: pipeline, pod: shop}, self, "before-any-claim") }).
			Should(beRefusedWith("nobody holds the lock"), "the namespace is fenced")
		asShop, asWeb := identity{user: pipeline, pod: shop}.client(), identity{user: pipeline, pod: web}.client()
		Expect(asShop.Create(ctx, claim(shop, "acme/shop", 41))).To(Succeed(), "a claim while nobody holds")
		expectPhase(self, "shop-41", buildlockv1.PhaseHeld)
		Expect(asWeb.Create(ctx, claim(web, "acme/web", 7))).To(Succeed(), "a claim while another build holds")
		expectPhase(self, "web-7", buildlockv1.PhaseWaiting)
		Expect(asWeb.Patch(ctx, getClaim(Default, self, "web-7"), mergePatch(map[string]any{"metadata": map[string]any{
			"labels": map[string]string{"renewed": "yes"}}}))).To(Succeed(), "a change of its own claim")

		Eventually(func() error { return deploy(identity{user: pipeline, pod: shop}, self, "from-holder") }).Should(Succeed())
		Expect(deploy(identity{user: pipeline, pod: web}, self, "from-waiter")).To(beRefusedWith("held by BuildLock " + self + "/shop-41"))
		Expect(asWeb.Delete(ctx, getClaim(Default, self, "shop-41"))).To(MatchError(ContainSubstring("only the BuildLocks it created")),
			"buildlock-claims still judges the claims")
		Expect(asWeb.Delete(ctx, getClaim(Default, self, "web-7"))).To(Succeed(), "a release")
	})
})

var _ = Describe("The enforcement binding", func() {
	It("is written once, not again on every decision of its lock", func() {
		ns := newNamespace()
		target := "bd-" + ns[len("bl-"):]
		namespaceNamed(target, map[string]string{buildlockv1.LockedByLabel: ns})
		writes := newWriteCounter()
		startScopedManager(testenv.ManagerOptions{NewClient: testenv.InterceptClient(*writes.funcs())}, ns)
		policy := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: target}}
		policy.Spec.Enforce = &buildlockv1.Enforcement{}
		Expect(k8sClient.Create(ctx, policy)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(policy), policy)).To(Succeed())
			g.Expect(meta.FindStatusCondition(policy.Status.Conditions, buildlockv1.ConditionEnforced)).
				To(HaveValue(HaveField("Reason", buildlockv1.ReasonEnforcing)))
		}).Should(Succeed())
		// The binding is the manager's only cluster-scoped write.
		bindingWrites := writes.total("")
		Expect(bindingWrites).To(Equal(1), "the binding's create")

		holderAndWaiter(ns, target)
		setPodPhase(ns, "shop-41", corev1.PodSucceeded)
		expectPhase(ns, "web-7", buildlockv1.PhaseHeld)
		Expect(writes.total("")).To(Equal(bindingWrites), "a hand-off writes no binding")
	})
})

// holderAndWaiter creates two claims on target, each with a pod named like
// it and named by UID, as an enforced target requires: shop-41, which holds,
// and web-7, which waits.
func holderAndWaiter(ns, target string) {
	GinkgoHelper()
	for _, c := range []struct {
		name, repo string
		build      int64
		phase      buildlockv1.Phase
	}{{"shop-41", "acme/shop", 41, buildlockv1.PhaseHeld}, {"web-7", "acme/web", 7, buildlockv1.PhaseWaiting}} {
		pod := createPod(ns, c.name)
		bl := newClaim(ns, c.name, claimOpts{target: target, repo: c.repo, build: c.build})
		bl.Spec.PodRef = &buildlockv1.PodReference{Name: pod.Name, UID: string(pod.UID)}
		Expect(k8sClient.Create(ctx, bl)).To(Succeed())
		expectPhase(ns, c.name, c.phase)
	}
}

// grantClusterWide lets user create the given cluster-scoped resource.
func grantClusterWide(user, group, resource string) {
	GinkgoHelper()
	name := fmt.Sprintf("fc-%d", time.Now().UnixNano())
	Expect(k8sClient.Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{group}, Resources: []string{resource}, Verbs: []string{"*"}}},
	})).To(Succeed())
	Expect(k8sClient.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	})).To(Succeed())
}
