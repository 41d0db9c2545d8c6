package controller_test

import (
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// Issue 31: a branch's workflows, who owns them, and a memory of lines that
// is full, against the real API server with the identity policies (the
// suite installs them) and without verified identities.

// afterTheRequesterPolicy waits until a claim created now counts as created
// after the buildlock-requester policy (the manager's RequesterSettle,
// shortened by the specs that use this).
func afterTheRequesterPolicy() {
	GinkgoHelper()
	var policy admissionv1.MutatingAdmissionPolicy
	Expect(k8sClient.Get(ctx, types.NamespacedName{Name: "buildlock-requester"}, &policy)).To(Succeed())
	time.Sleep(time.Until(policy.CreationTimestamp.Add(2 * time.Second)))
}

// claimOfWorkflow is a claim of build n of acme/shop@main of workflow
// (none if empty), started at started (none if zero).
func claimOfWorkflow(ns, name, workflow string, n int64, started time.Time) *buildlockv1.BuildLock {
	bl := newClaim(ns, name, claimOpts{repo: "acme/shop", build: n, timestamp: started})
	bl.Spec.Workflow = workflow
	return bl
}

// holdAndGo creates bl as id, waits until it holds, and deletes it, as a
// pipeline whose deploy is done does; it returns the token it held with.
func holdAndGo(id identity, bl *buildlockv1.BuildLock) int64 {
	GinkgoHelper()
	Expect(id.client().Create(ctx, bl)).To(Succeed())
	held := expectPhase(bl.Namespace, bl.Name, buildlockv1.PhaseHeld)
	Expect(id.client().Delete(ctx, held)).To(Succeed())
	Eventually(func(g Gomega) {
		g.Expect(getLease(g, bl.Namespace, "staging").Spec.HolderIdentity).To(BeNil())
	}).Should(Succeed())
	return held.Status.FencingToken
}

var _ = Describe("A branch's lines", func() {
	var (
		ns        string
		shop, web identity
	)
	start := func(o testenv.ManagerOptions) {
		GinkgoHelper()
		ns = newNamespace()
		o.Namespaces = []string{ns}
		mgr, err := testenv.StartManager(ctx, cfg, o)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(mgr.Stop()).To(Succeed()) })
		shop = identity{user: "system:serviceaccount:" + ns + ":shop"}
		web = identity{user: "system:serviceaccount:" + ns + ":web"}
		grantAll(ns, shop.user)
		grantAll(ns, web.user)
	}

	// Break 5: with rollbacks: Nobody and reruns: Refused, build 42 holds
	// and goes; builds 41 and 42 of made-up workflows must not deploy.
	for _, verified := range []bool{true, false} {
		It(fmt.Sprintf("lets no workflow name escape the branch's memory or reruns: Refused (verified identities: %v)", verified), func() {
			settle := time.Nanosecond
			if !verified {
				settle = 1000 * time.Hour // nothing counts as verified
			}
			start(testenv.ManagerOptions{RequesterSettle: settle})
			afterTheRequesterPolicy()
			setPolicy(ns, buildlockv1.BuildLockPolicySpec{Rollbacks: buildlockv1.RollbacksNobody, Reruns: buildlockv1.RerunsRefused})

			token := holdAndGo(shop, claimOfWorkflow(ns, "shop-42", "", 42, time.Time{}))
			for name, bl := range map[string]*buildlockv1.BuildLock{
				"shop-41":   claimOfWorkflow(ns, "shop-41", "", 41, time.Time{}),
				"shop-41-x": claimOfWorkflow(ns, "shop-41-x", "x", 41, time.Time{}),
				"shop-42-y": claimOfWorkflow(ns, "shop-42-y", "y", 42, time.Time{}),
			} {
				Expect(shop.client().Create(ctx, bl)).To(Succeed())
				refused := expectPhase(ns, name, buildlockv1.PhaseSuperseded)
				Expect(refused.Status.FencingToken).To(BeZero(), "%s got a token", name)
				Expect(refused.Status.Message).To(ContainSubstring("Build 42 of acme/shop@main"))
				if name == "shop-42-y" {
					Expect(refused.Status.Reason).To(Equal(buildlockv1.ReasonDuplicateBuild))
					Expect(refused.Status.Message).To(ContainSubstring("workflow y is not verified"))
				}
			}
			Consistently(func(g Gomega) {
				g.Expect(getLease(g, ns, "staging").Spec.LeaseTransitions).To(HaveValue(BeEquivalentTo(token)), "no new grant")
			}, "1s").Should(Succeed())
		})
	}

	It("never deploys the slower of two workflows' builds after the newer (break 5, as ordinary CI has it)", func() {
		start(testenv.ManagerOptions{RequesterSettle: time.Nanosecond})
		afterTheRequesterPolicy()
		now := time.Now().UTC()
		// deploy.yml's run started second but was quicker.
		holdAndGo(shop, claimOfWorkflow(ns, "deploy-500", "acme/shop/.github/workflows/deploy.yml", 500, now.Add(-2*time.Minute)))
		Expect(shop.client().Create(ctx, claimOfWorkflow(ns, "hotfix-12", "acme/shop/.github/workflows/hotfix.yml", 12,
			now.Add(-3*time.Minute)))).To(Succeed())
		slow := expectPhase(ns, "hotfix-12", buildlockv1.PhaseSuperseded)
		Expect(slow.Status.Reason).To(Equal(buildlockv1.ReasonSupersededByNewerBuild))
		Expect(slow.Status.Message).To(ContainSubstring("a branch never deploys an older build after a newer one"))
		Expect(getLease(Default, ns, "staging").Annotations["buildlock.io/lines"]).To(ContainSubstring(`"started":"`))

		// A build of the other workflow that started later deploys.
		holdAndGo(shop, claimOfWorkflow(ns, "hotfix-13", "acme/shop/.github/workflows/hotfix.yml", 13, now.Add(-time.Minute)))
	})

	// Break 6: the pipeline of acme/shop held acme/shop@main (before the
	// plugin filled the workflow in); another team's pipeline may not take
	// a workflow line of it, and so cannot lock acme/shop's pipeline out.
	It("keeps a branch's workflow lines its owner's", func() {
		start(testenv.ManagerOptions{RequesterSettle: time.Nanosecond})
		afterTheRequesterPolicy()
		holdAndGo(shop, claimOfWorkflow(ns, "shop-42", "", 42, time.Time{}))

		Expect(web.client().Create(ctx, claimOfWorkflow(ns, "squat-43", "acme/shop/.github/workflows/deploy.yml", 43, time.Time{}))).To(Succeed())
		squat := expectPhase(ns, "squat-43", buildlockv1.PhaseSuperseded)
		Expect(squat.Status.Reason).To(Equal(buildlockv1.ReasonLineOwnedByOther))
		Expect(squat.Status.Message).To(ContainSubstring("its branch acme/shop@main belongs to " + shop.user))

		holdAndGo(shop, claimOfWorkflow(ns, "deploy-43", "acme/shop/.github/workflows/deploy.yml", 43, time.Time{}))
	})

	// Break 8: one pipeline holds line after fake line; another team's new
	// line must never deploy its build 4 after its build 5.
	for _, verified := range []bool{true, false} {
		It(fmt.Sprintf("never lets a line flood reopen a rollback (verified identities: %v)", verified), func() {
			settle := time.Nanosecond
			if !verified {
				settle = 1000 * time.Hour
			}
			start(testenv.ManagerOptions{RequesterSettle: settle})
			afterTheRequesterPolicy()
			intruder := identity{user: "system:serviceaccount:" + ns + ":intruder"}
			grantAll(ns, intruder.user)
			fakes := intruder.client()
			long := strings.Repeat("b", 255)
			// Fake lines until one is not granted: the memory (its share of
			// it, when identities are verified) is full.
			full := false
			for k := 0; !full; k++ {
				Expect(k).To(BeNumerically("<", 400), "the memory never filled")
				bl := newClaim(ns, fmt.Sprintf("fake-%03d", k), claimOpts{repo: fmt.Sprintf("fake/app-%03d", k), branch: long, build: 1})
				bl.Spec.Workflow = long
				Expect(fakes.Create(ctx, bl)).To(Succeed())
				Eventually(func(g Gomega) {
					got := getClaim(g, ns, bl.Name)
					g.Expect(got.Status.Phase).To(BeElementOf(buildlockv1.PhaseHeld, buildlockv1.PhaseWaiting))
					full = got.Status.Reason == buildlockv1.ReasonLineMemoryFull
				}).Should(Succeed())
				Expect(fakes.Delete(ctx, bl)).To(Succeed())
			}

			victim := identity{user: "system:serviceaccount:" + ns + ":victim"}
			grantAll(ns, victim.user)
			five := newClaim(ns, "victim-5", claimOpts{repo: "acme/victim", build: 5})
			Expect(victim.client().Create(ctx, five)).To(Succeed())
			if verified {
				// Its own share of the memory has room: it deploys, and is
				// remembered.
				held := expectPhase(ns, "victim-5", buildlockv1.PhaseHeld)
				Expect(victim.client().Delete(ctx, held)).To(Succeed())
				Expect(victim.client().Create(ctx, newClaim(ns, "victim-4", claimOpts{repo: "acme/victim", build: 4}))).To(Succeed())
				Expect(expectPhase(ns, "victim-4", buildlockv1.PhaseSuperseded).Status.Reason).To(Equal(buildlockv1.ReasonSupersededByNewerBuild))
				return
			}
			// One budget for every claim: the new line waits rather than
			// deploy unremembered, and says why.
			Eventually(func(g Gomega) {
				got := getClaim(g, ns, "victim-5")
				g.Expect(got.Status.Reason).To(Equal(buildlockv1.ReasonLineMemoryFull))
				g.Expect(got.Status.Message).To(ContainSubstring("cannot be remembered"))
			}).Should(Succeed())
			Consistently(func(g Gomega) {
				g.Expect(getClaim(g, ns, "victim-5").Status.Phase).To(Equal(buildlockv1.PhaseWaiting))
			}, "1s").Should(Succeed())
		})
	}
})

var _ = Describe("Look-alike text in annotations", func() {
	It("refuses invisible and bidirectional characters in a reason or run id, naming the character and its position", func() {
		ns := newNamespace()
		createClaim(ns, "shop-42", claimOpts{repo: "acme/shop", build: 42})
		for _, key := range buildlockv1.TextAnnotations {
			bl := getClaim(Default, ns, "shop-42")
			patch := client.MergeFrom(bl.DeepCopy())
			metav1.SetMetaDataAnnotation(&bl.ObjectMeta, key, "alice: INC\u200b-7")
			err := k8sClient.Patch(ctx, bl, patch)
			Expect(err).To(MatchError(ContainSubstring(
				"annotation " + key + " must not contain invisible, bidirectional or control characters: it has U+200B at character 11")))
		}
		// A plain reason is admitted.
		bl := getClaim(Default, ns, "shop-42")
		patch := client.MergeFrom(bl.DeepCopy())
		metav1.SetMetaDataAnnotation(&bl.ObjectMeta, buildlockv1.RunIDAnnotation, "5005/1")
		Expect(k8sClient.Patch(ctx, bl, patch)).To(Succeed())
	})
})
