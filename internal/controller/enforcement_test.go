package controller_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
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

// identity is who a request comes from: a person, or a service account with
// or without a pod-bound token (impersonated with the token's extras, as the
// API server would authenticate it).
type identity struct {
	user string
	pod  *corev1.Pod
}

func (id identity) client() client.Client {
	GinkgoHelper()
	cl, err := client.New(id.config(), client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	return cl
}

// config is a connection to the suite's API server as id.
func (id identity) config() *rest.Config { return id.configOn(cfg) }

// configOn is a connection to the API server of base as id.
func (id identity) configOn(base *rest.Config) *rest.Config {
	c := rest.CopyConfig(base)
	c.Impersonate = rest.ImpersonationConfig{UserName: id.user, Groups: []string{"system:authenticated"}}
	if rest, ok := strings.CutPrefix(id.user, "system:serviceaccount:"); ok {
		ns, _, _ := strings.Cut(rest, ":")
		c.Impersonate.Groups = append(c.Impersonate.Groups, "system:serviceaccounts", "system:serviceaccounts:"+ns)
	}
	if id.pod != nil {
		c.Impersonate.Extra = map[string][]string{
			"authentication.kubernetes.io/pod-name": {id.pod.Name},
			"authentication.kubernetes.io/pod-uid":  {string(id.pod.UID)},
		}
	}
	return c
}

// grantAll gives user every right in namespace ns.
func grantAll(ns, user string) {
	GinkgoHelper()
	grantAllTo(ns, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user})
}

// grantAllTo gives subject every right in namespace ns.
func grantAllTo(ns string, subject rbacv1.Subject) {
	GinkgoHelper()
	name := fmt.Sprintf("all-%d", time.Now().UnixNano())
	Expect(k8sClient.Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}}},
	})).To(Succeed())
	Expect(k8sClient.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{subject},
	})).To(Succeed())
}

// deploy writes a ConfigMap into ns as id: what a pipeline's deploy does.
func deploy(id identity, ns, name string) error {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string]string{"by": id.user}}
	return id.client().Create(ctx, cm)
}

// beRefusedWith matches a Forbidden error mentioning every want.
func beRefusedWith(wants ...string) OmegaMatcher {
	matchers := []OmegaMatcher{Satisfy(apierrors.IsForbidden)}
	for _, w := range wants {
		matchers = append(matchers, MatchError(ContainSubstring(w)))
	}
	return SatisfyAll(matchers...)
}

// namespaceNamed creates a namespace with the given name and labels.
func namespaceNamed(name string, labels map[string]string) {
	GinkgoHelper()
	Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}})).To(Succeed())
}

var _ = Describe("The enforced lock", Ordered, func() {
	var (
		ci, target, other string
		pipeline          string // the pipeline service account's user name
		shop, web         *corev1.Pod
		person            = identity{user: "alice"}
		operator          *testenv.Manager
	)

	enforcedCondition := func(g Gomega, ns, name string) *metav1.Condition {
		var p buildlockv1.BuildLockPolicy
		g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &p)).To(Succeed())
		c := meta.FindStatusCondition(p.Status.Conditions, buildlockv1.ConditionEnforced)
		g.Expect(c).NotTo(BeNil())
		return c
	}

	BeforeAll(func() {
		ci = newNamespace()
		target = "stg-" + ci[len("bl-"):]
		other = newNamespace()
		namespaceNamed(target, map[string]string{buildlockv1.LockedByLabel: ci})
		pipeline = "system:serviceaccount:" + ci + ":pipeline"
		for _, ns := range []string{ci, target} {
			grantAll(ns, pipeline)
			grantAll(ns, person.user)
			grantAll(ns, "system:serviceaccount:"+ci+":docs-bot")
			grantAll(ns, "system:serviceaccount:"+other+":pipeline")
		}
		shop, web = createPod(ci, "shop-41"), createPod(ci, "web-7")

		operator = startScopedManager(testenv.ManagerOptions{}, ci, other)
		policy := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ci, Name: target}}
		policy.Spec.Enforce = &buildlockv1.Enforcement{ServiceAccounts: []string{"pipeline"}}
		Expect(k8sClient.Create(ctx, policy)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(enforcedCondition(g, ci, target).Reason).To(Equal(buildlockv1.ReasonEnforcing))
		}).WithTimeout(5 * time.Second).Should(Succeed())
	})

	claimAs := func(id identity, name, repo string, build int64, pod *corev1.Pod) {
		GinkgoHelper()
		bl := newClaim(ci, name, claimOpts{target: target, repo: repo, build: build})
		if pod != nil {
			bl.Spec.PodRef = &buildlockv1.PodReference{Name: pod.Name, UID: string(pod.UID)}
		}
		Expect(id.client().Create(ctx, bl)).To(Succeed())
	}

	It("refuses a pipeline's write while the lock is free, and says how to take it", func() {
		Eventually(func() error { return deploy(identity{user: pipeline, pod: shop}, target, "early") }).
			WithTimeout(5 * time.Second).Should(beRefusedWith("nobody holds the lock", "kubectl buildlock acquire -n "+ci+" --target "+target))
	})

	It("stamps each claim with its requester", func() {
		claimAs(identity{user: pipeline, pod: shop}, "shop-41", "acme/shop", 41, shop)
		bl := expectPhase(ci, "shop-41", buildlockv1.PhaseHeld)
		Expect(bl.Spec.Requester).To(Equal(&buildlockv1.Requester{Username: pipeline, PodName: shop.Name, PodUID: string(shop.UID)}))
		claimAs(identity{user: pipeline, pod: web}, "web-7", "acme/web", 7, web)
		expectPhase(ci, "web-7", buildlockv1.PhaseWaiting)
	})

	It("admits the holder's pod and refuses the waiter's, with the holder and token in the message", func() {
		Eventually(func() error { return deploy(identity{user: pipeline, pod: shop}, target, "from-holder") }).
			WithTimeout(5 * time.Second).Should(Succeed())
		Expect(deploy(identity{user: pipeline, pod: web}, target, "from-waiter")).
			To(beRefusedWith("held by BuildLock "+ci+"/shop-41 (fencing token 1)", "kubectl buildlock acquire"))
		Expect(deploy(identity{user: pipeline}, target, "from-no-pod")).To(beRefusedWith("held by BuildLock"))
	})

	It("never restricts reads", func() {
		var cm corev1.ConfigMap
		Expect(identity{user: pipeline, pod: web}.client().Get(ctx, types.NamespacedName{Namespace: target, Name: "from-holder"}, &cm)).To(Succeed())
	})

	It("admits people, service accounts that are not pipelines, and other namespaces' pipelines", func() {
		Expect(deploy(person, target, "from-alice")).To(Succeed())
		Expect(deploy(identity{user: "system:serviceaccount:" + ci + ":docs-bot"}, target, "from-docs-bot")).To(Succeed())
		Expect(deploy(identity{user: "system:serviceaccount:" + other + ":pipeline"}, target, "from-other-namespace")).To(Succeed())
	})

	It("fences nothing outside the target namespace", func() {
		Expect(deploy(identity{user: pipeline, pod: web}, ci, "in-the-claims-namespace")).To(Succeed())
	})

	It("refuses a claim that names another pod than the one it comes from", func() {
		bl := newClaim(ci, "web-8", claimOpts{target: target, repo: "acme/web", build: 8})
		bl.Spec.PodRef = &buildlockv1.PodReference{Name: shop.Name, UID: string(shop.UID)}
		err := identity{user: pipeline, pod: web}.client().Create(ctx, bl)
		Expect(err).To(MatchError(ContainSubstring("spec.podRef must name the pod this request comes from")))
	})

	It("overwrites a requester a client tries to set for another", func() {
		// Another target: a newer build on this one would supersede the waiter.
		bl := newClaim(ci, "docs-1", claimOpts{target: "docs-only", repo: "acme/docs", build: 1})
		bl.Spec.Requester = &buildlockv1.Requester{Username: "alice", PodUID: string(shop.UID)}
		Expect(identity{user: pipeline}.client().Create(ctx, bl)).To(Succeed())
		Expect(getClaim(Default, ci, "docs-1").Spec.Requester).To(Equal(&buildlockv1.Requester{Username: pipeline}))
		Expect(k8sClient.Delete(ctx, bl)).To(Succeed())
	})

	It("requires podRef.uid on an enforced target", func() {
		bl := newClaim(ci, "api-3", claimOpts{target: target, repo: "acme/api", build: 3})
		bl.Spec.PodRef = &buildlockv1.PodReference{Name: "api-3"}
		Expect(identity{user: pipeline}.client().Create(ctx, bl)).To(MatchError(ContainSubstring("spec.podRef needs the pod uid")))
	})

	It("lets a pipeline touch only its own claims, and leaves force-release to people", func() {
		asWeb := identity{user: pipeline, pod: web}.client()
		shopClaim := getClaim(Default, ci, "shop-41")
		Expect(asWeb.Delete(ctx, shopClaim)).To(MatchError(ContainSubstring("a pipeline may change or delete only the BuildLocks it created")))
		renew := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"renewTime":"2026-12-01T00:00:00Z"}}`))
		Expect(asWeb.Patch(ctx, shopClaim.DeepCopy(), renew)).To(MatchError(ContainSubstring("only the BuildLocks it created")))
		release := func(reason string) client.Patch {
			patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{buildlockv1.ForceReleaseAnnotation: reason}}})
			Expect(err).NotTo(HaveOccurred())
			return client.RawPatch(types.MergePatchType, patch)
		}
		Expect(identity{user: pipeline, pod: shop}.client().Patch(ctx, shopClaim.DeepCopy(), release("shop: me"))).
			To(MatchError(ContainSubstring("Force-release is for people")))
		Expect(asWeb.Patch(ctx, getClaim(Default, ci, "web-7"), client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"mine":"yes"}}}`)))).
			To(Succeed(), "its own claim")

		By("a person force-releases the holder: the old holder is refused, the new one admitted")
		Expect(person.client().Patch(ctx, shopClaim.DeepCopy(), release("alice: stuck"))).To(Succeed())
		expectPhase(ci, "web-7", buildlockv1.PhaseHeld)
		Eventually(func() error {
			return deploy(identity{user: pipeline, pod: shop}, target, fmt.Sprintf("late-%d", time.Now().UnixNano()))
		}).
			WithTimeout(5 * time.Second).Should(beRefusedWith("held by BuildLock " + ci + "/web-7 (fencing token 2)"))
		Eventually(func() error { return deploy(identity{user: pipeline, pod: web}, target, "from-new-holder") }).
			WithTimeout(5 * time.Second).Should(Succeed())
	})

	It("enforces nothing where the target does not consent, and reports which half is missing", func() {
		unconsenting := "stg2-" + ci[len("bl-"):]
		namespaceNamed(unconsenting, nil)
		grantAll(unconsenting, pipeline)
		policy := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ci, Name: unconsenting}}
		policy.Spec.Enforce = &buildlockv1.Enforcement{}
		Expect(k8sClient.Create(ctx, policy)).To(Succeed())
		Eventually(func(g Gomega) {
			c := enforcedCondition(g, ci, unconsenting)
			g.Expect(c.Reason).To(Equal(buildlockv1.ReasonConsentMissing))
			g.Expect(c.Message).To(ContainSubstring(buildlockv1.LockedByLabel + "=" + ci))
		}).WithTimeout(5 * time.Second).Should(Succeed())
		Consistently(func() error {
			return deploy(identity{user: pipeline, pod: web}, unconsenting, fmt.Sprintf("free-%d", time.Now().UnixNano()))
		}).
			WithTimeout(time.Second).Should(Succeed())
	})

	It("lets only one claims namespace enforce a target", func() {
		policy := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: other, Name: target}}
		policy.Spec.Enforce = &buildlockv1.Enforcement{}
		Expect(k8sClient.Create(ctx, policy)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(enforcedCondition(g, other, target).Reason).To(Equal(buildlockv1.ReasonConflict))
		}).WithTimeout(5 * time.Second).Should(Succeed())
		Expect(deploy(identity{user: "system:serviceaccount:" + other + ":pipeline"}, target, "other-still-free")).To(Succeed())
	})

	It("stops enforcing at once when the namespace's label is removed (break-glass)", func() {
		var ns corev1.Namespace
		Expect(k8sClient.Get(ctx, types.NamespacedName{Name: target}, &ns)).To(Succeed())
		delete(ns.Labels, buildlockv1.LockedByLabel)
		Expect(k8sClient.Update(ctx, &ns)).To(Succeed())
		Eventually(func() error {
			return deploy(identity{user: pipeline, pod: shop}, target, fmt.Sprintf("glass-%d", time.Now().UnixNano()))
		}).
			WithTimeout(5 * time.Second).Should(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(enforcedCondition(g, ci, target).Reason).To(Equal(buildlockv1.ReasonConsentMissing))
		}).WithTimeout(5 * time.Second).Should(Succeed())
	})

	It("authenticates a real pod-bound token and fences it like the impersonated one", func() {
		var ns corev1.Namespace
		Expect(k8sClient.Get(ctx, types.NamespacedName{Name: target}, &ns)).To(Succeed())
		ns.Labels[buildlockv1.LockedByLabel] = ci
		Expect(k8sClient.Update(ctx, &ns)).To(Succeed())

		Expect(k8sClient.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ci, Name: "pipeline"}})).To(Succeed())
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ci, Name: "token-pod"},
			Spec:       corev1.PodSpec{ServiceAccountName: "pipeline", Containers: []corev1.Container{{Name: "build", Image: "busybox"}}},
		}
		Expect(k8sClient.Create(ctx, pod)).To(Succeed())
		clientset, err := kubernetes.NewForConfig(cfg)
		Expect(err).NotTo(HaveOccurred())
		tr, err := clientset.CoreV1().ServiceAccounts(ci).CreateToken(ctx, "pipeline", &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{
				ExpirationSeconds: ptr.To(int64(600)),
				BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
			},
		}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		tokenCfg := rest.AnonymousClientConfig(cfg)
		tokenCfg.BearerToken = tr.Status.Token
		asPod, err := client.New(tokenCfg, client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())

		deployWithToken := func(name string) error {
			return asPod.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: target, Name: name}})
		}
		Eventually(func() error { return deployWithToken(fmt.Sprintf("token-early-%d", time.Now().UnixNano())) }).
			WithTimeout(5 * time.Second).Should(beRefusedWith("held by BuildLock " + ci + "/web-7"))

		bl := newClaim(ci, "docs-2", claimOpts{target: target, repo: "acme/docs", build: 2})
		bl.Spec.PodRef = &buildlockv1.PodReference{Name: pod.Name, UID: string(pod.UID)}
		Expect(asPod.Create(ctx, bl)).To(Succeed())
		Expect(getClaim(Default, ci, "docs-2").Spec.Requester).To(Equal(&buildlockv1.Requester{
			Username: pipeline, PodName: pod.Name, PodUID: string(pod.UID)}), "the token's pod, stamped at admission")
		setPodPhase(ci, "web-7", corev1.PodSucceeded)
		expectPhase(ci, "docs-2", buildlockv1.PhaseHeld)
		Eventually(func() error { return deployWithToken("token-holder") }).WithTimeout(5 * time.Second).Should(Succeed())

		By("the holder whose pod finished is refused after the hand-off")
		Eventually(func() error {
			return deploy(identity{user: pipeline, pod: web}, target, fmt.Sprintf("after-pod-end-%d", time.Now().UnixNano()))
		}).WithTimeout(5 * time.Second).Should(beRefusedWith("held by BuildLock " + ci + "/docs-2 (fencing token 3)"))

		By("with the operator down, the last grant is still enforced: its holder deploys, nobody else does")
		Expect(operator.Stop()).To(Succeed())
		Expect(deployWithToken("token-holder-operator-down")).To(Succeed())
		Expect(deploy(identity{user: pipeline, pod: shop}, target, "other-operator-down")).To(beRefusedWith("held by BuildLock " + ci + "/docs-2"))
	})
})
