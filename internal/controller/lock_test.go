package controller_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

var _ = Describe("The lock controller", Ordered, func() {
	var (
		mgr    *testenv.Manager
		writes *writeCounter
		clock  *offsetClock
		ns     string
	)

	BeforeAll(func() {
		writes = newWriteCounter()
		clock = &offsetClock{}
		var err error
		mgr, err = testenv.StartManager(ctx, cfg, testenv.ManagerOptions{NewClient: testenv.InterceptClient(*writes.funcs()), Clock: clock})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(mgr.Stop()).To(Succeed()) })
	})
	BeforeEach(func() { ns = newNamespace() })

	It("grants a free lock at once, with fencing token 1", func() {
		bl := createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		got := expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		Expect(got.Status.FencingToken).To(Equal(int64(1)))
		Expect(got.Status.Holder).To(Equal("shop-41"))
		Expect(got.Status.AcquiredAt).NotTo(BeNil())
		Expect(got.Status.ObservedGeneration).To(Equal(got.Generation))
		Expect(got.Status.Conditions).To(ContainElement(And(
			HaveField("Type", buildlockv1.ConditionAcquired),
			HaveField("Status", metav1.ConditionTrue),
			HaveField("Reason", buildlockv1.ReasonAcquired))))
		// The message is said once, in status.message.
		Expect(got.Status.Message).To(ContainSubstring("fencing token 1"))
		Expect(got.Status.Conditions).To(HaveEach(HaveField("Message", "")))
		expectGrant(ns, "staging", bl, 1)
		Eventually(func(g Gomega) []string { return eventReasons(g, ns, "shop-41") }).Should(ContainElement("Acquired"))
	})

	It("puts another repo's build in the waiting slot, then supersedes it with a newer build of its line", func() {
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)

		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		waiting := expectPhase(ns, "web-7", buildlockv1.PhaseWaiting)
		Expect(waiting.Status.Holder).To(Equal("shop-41"))
		Expect(waiting.Status.Reason).To(Equal(buildlockv1.ReasonWaitingForHolder))
		Expect(waiting.Status.Conditions).To(ContainElement(And(
			HaveField("Type", buildlockv1.ConditionAcquired), HaveField("Status", metav1.ConditionFalse))))

		createClaim(ns, "web-8", claimOpts{repo: "acme/web", build: 8, pod: "web-8"})
		old := expectPhase(ns, "web-7", buildlockv1.PhaseSuperseded)
		Expect(old.Status.SupersededBy).To(Equal("web-8"))
		Expect(old.Status.Reason).To(Equal(buildlockv1.ReasonSupersededByNewerBuild))
		Expect(old.Status.Message).To(ContainSubstring("8"))
		Expect(old.Status.FinishedAt).NotTo(BeNil())
		expectPhase(ns, "web-8", buildlockv1.PhaseWaiting)
		Consistently(func(g Gomega) []string { return eventReasons(g, ns, "web-7") }).WithTimeout(500*time.Millisecond).
			Should(BeEmpty(), "a claim that waits or is superseded gets its status, and no Event")
		Expect(expectPhase(ns, "shop-41", buildlockv1.PhaseHeld).Status.Waiting).To(BeEmpty(), "a holder's status names no waiter")
	})

	It("never rewrites the holder's status when a claim starts waiting or replaces the waiter", func() {
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		held := expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		expectPhase(ns, "web-7", buildlockv1.PhaseWaiting)
		createClaim(ns, "web-8", claimOpts{repo: "acme/web", build: 8, pod: "web-8"})
		expectPhase(ns, "web-7", buildlockv1.PhaseSuperseded)
		Expect(expectPhase(ns, "web-8", buildlockv1.PhaseWaiting).Status.Holder).To(Equal("shop-41"))
		Consistently(func(g Gomega) string { return getClaim(g, ns, "shop-41").ResourceVersion }, "2s").
			Should(Equal(held.ResourceVersion), "one status write per claim per change of its own verdict")
	})

	It("supersedes an older build of the holder's line at once, and never pre-empts the holder", func() {
		createClaim(ns, "shop-42", claimOpts{repo: "acme/shop", build: 42, pod: "shop-42"})
		expectPhase(ns, "shop-42", buildlockv1.PhaseHeld)
		createClaim(ns, "shop-40", claimOpts{repo: "acme/shop", build: 40, pod: "shop-40"})
		Expect(expectPhase(ns, "shop-40", buildlockv1.PhaseSuperseded).Status.SupersededBy).To(Equal("shop-42"))
		createClaim(ns, "shop-43", claimOpts{repo: "acme/shop", build: 43, pod: "shop-43"})
		expectPhase(ns, "shop-43", buildlockv1.PhaseWaiting)
		Consistently(func(g Gomega) buildlockv1.Phase { return getClaim(g, ns, "shop-42").Status.Phase }, "2s").Should(Equal(buildlockv1.PhaseHeld))
	})

	It("hands the lock to the waiter with the next token when the holder is deleted", func() {
		holder := createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		waiter := createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		expectPhase(ns, "web-7", buildlockv1.PhaseWaiting)

		Expect(k8sClient.Delete(ctx, holder)).To(Succeed())
		got := expectPhase(ns, "web-7", buildlockv1.PhaseHeld)
		Expect(got.Status.FencingToken).To(Equal(int64(2)))
		expectGrant(ns, "staging", waiter, 2)
	})

	DescribeTable("hands the lock over when the holder's pod ends",
		func(end func(ns, pod string), reason string) {
			createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
			expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
			createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
			expectPhase(ns, "web-7", buildlockv1.PhaseWaiting)

			end(ns, "shop-41")
			Expect(expectPhase(ns, "web-7", buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(int64(2)))
			old := expectPhase(ns, "shop-41", buildlockv1.PhaseReleased)
			Expect(old.Status.Reason).To(Equal(reason))
			Expect(old.Status.Conditions).To(ContainElement(And(
				HaveField("Type", buildlockv1.ConditionAcquired), HaveField("Status", metav1.ConditionFalse))))
			Eventually(func(g Gomega) []string { return eventReasons(g, ns, "shop-41") }).Should(ContainElement("Released"))
		},
		Entry("Succeeded", func(ns, pod string) { setPodPhase(ns, pod, corev1.PodSucceeded) }, buildlockv1.ReasonPodFinished),
		Entry("Failed", func(ns, pod string) { setPodPhase(ns, pod, corev1.PodFailed) }, buildlockv1.ReasonPodFinished),
		Entry("deleted", func(ns, pod string) {
			Expect(k8sClient.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod}}, client.GracePeriodSeconds(0))).To(Succeed())
		}, buildlockv1.ReasonPodGone),
	)

	It("ends a force-released hold and hands the lock on, keeping who and why", func() {
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		expectPhase(ns, "web-7", buildlockv1.PhaseWaiting)

		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"alice: deploy is stuck"}}}`, buildlockv1.ForceReleaseAnnotation)
		Expect(k8sClient.Patch(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "shop-41"}},
			client.RawPatch(types.MergePatchType, []byte(patch)))).To(Succeed())
		old := expectPhase(ns, "shop-41", buildlockv1.PhaseReleased)
		Expect(old.Status.Reason).To(Equal(buildlockv1.ReasonForceReleased))
		Expect(old.Status.Message).To(ContainSubstring("alice: deploy is stuck"))
		Expect(expectPhase(ns, "web-7", buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(int64(2)))
	})

	It("releases a waiter whose pod is deleted and frees the slot", func() {
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		expectPhase(ns, "web-7", buildlockv1.PhaseWaiting)

		Expect(k8sClient.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-7"}}, client.GracePeriodSeconds(0))).To(Succeed())
		Expect(expectPhase(ns, "web-7", buildlockv1.PhaseReleased).Status.Reason).To(Equal(buildlockv1.ReasonPodGone))
		Eventually(func(g Gomega) string { return getClaim(g, ns, "shop-41").Status.Waiting }).Should(BeEmpty())

		// The freed slot goes to the next claim, even an older one.
		createClaim(ns, "api-3", claimOpts{repo: "acme/api", build: 3, pod: "api-3", timestamp: time.Now().Add(-time.Hour)})
		expectPhase(ns, "api-3", buildlockv1.PhaseWaiting)
	})

	It("releases a claim whose pod never existed, with a message that says so", func() {
		bl := newClaim(ns, "ghost-1", claimOpts{repo: "acme/ghost", build: 1})
		bl.Spec.PodRef = &buildlockv1.PodReference{Name: "no-such-pod"}
		Expect(k8sClient.Create(ctx, bl)).To(Succeed())
		got := expectPhase(ns, "ghost-1", buildlockv1.PhaseReleased)
		Expect(got.Status.Reason).To(Equal(buildlockv1.ReasonPodGone))
		Expect(got.Status.Message).To(ContainSubstring("gone"))
	})

	It("expires a pod-less holder that is not renewed and hands the lock over", func() {
		createClaim(ns, "nopod-1", claimOpts{repo: "acme/cli", build: 1, expiresAfter: 10 * time.Second})
		held := expectPhase(ns, "nopod-1", buildlockv1.PhaseHeld)
		Expect(held.Status.ExpiresAt).NotTo(BeNil())
		Expect(held.Status.ExpiresAt.Sub(held.Status.AcquiredAt.Time)).To(Equal(10 * time.Second))
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		expectPhase(ns, "web-7", buildlockv1.PhaseWaiting)

		// Renewing moves the expiry forward.
		Eventually(func() error {
			bl := getClaim(Default, ns, "nopod-1")
			bl.Spec.RenewTime = buildlockv1.NewTimestamp(clock.Now())
			return k8sClient.Update(ctx, bl)
		}).Should(Succeed())
		Eventually(func(g Gomega) bool {
			bl := getClaim(g, ns, "nopod-1")
			return bl.Status.ExpiresAt.After(held.Status.ExpiresAt.Time)
		}).Should(BeTrue())

		clock.advance(11 * time.Second)
		poke(ns, "nopod-1")
		Expect(expectPhase(ns, "nopod-1", buildlockv1.PhaseExpired).Status.Reason).To(Equal(buildlockv1.ReasonExpired))
		Expect(expectPhase(ns, "web-7", buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(int64(2)))
	})

	It("changes nothing when the same manifest is applied again, and writes nothing at steady state", func() {
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		expectPhase(ns, "web-7", buildlockv1.PhaseWaiting)
		Eventually(func(g Gomega) string { return getClaim(g, ns, "web-7").Status.Holder }).Should(Equal("shop-41"))

		before := writes.total(ns)
		again := newClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		again.SetGroupVersionKind(buildlockv1.GroupVersion.WithKind("BuildLock"))
		//nolint:staticcheck // client.Apply is what `kubectl apply --server-side` does.
		Expect(k8sClient.Patch(ctx, again, client.Apply, client.FieldOwner("pipeline"), client.ForceOwnership)).To(Succeed())
		poke(ns, "web-7")
		Consistently(func() int { return writes.total(ns) - before }, "3s").Should(BeZero())
		Expect(getClaim(Default, ns, "shop-41").Status.FencingToken).To(Equal(int64(1)))
	})

	It("keeps two targets apart", func() {
		createClaim(ns, "shop-staging", claimOpts{target: "staging", repo: "acme/shop", build: 1, pod: "p1"})
		createClaim(ns, "shop-prod", claimOpts{target: "production", repo: "acme/shop", build: 1, pod: "p2"})
		staging := expectPhase(ns, "shop-staging", buildlockv1.PhaseHeld)
		prod := expectPhase(ns, "shop-prod", buildlockv1.PhaseHeld)
		// Each target has its own Lease and tokens (a Lease starts above
		// the namespace's token floor as it was read: both may start at 1
		// when they are created at once).
		expectGrant(ns, "staging", staging, int32(staging.Status.FencingToken))
		expectGrant(ns, "production", prod, int32(prod.Status.FencingToken))
	})

	It("re-decides when its grant write loses a race with the Lease changed behind its back", func() {
		holder := createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		waiter := createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		expectPhase(ns, "web-7", buildlockv1.PhaseWaiting)

		// Someone else advances the token: the next grant must be above it,
		// and above the namespace's token floor (the edit is somebody
		// else's: bug 15 of docs/reliability.md).
		Eventually(func() error {
			lease := getLease(Default, ns, "staging")
			lease.Spec.LeaseTransitions = ptr.To(int32(10))
			return k8sClient.Update(ctx, lease)
		}).Should(Succeed())
		next := max(10, tokenFloorOf(Default, ns)) + 1
		// And the manager's next three writes fail with conflicts.
		writes.conflicts.Store(3)
		Expect(k8sClient.Delete(ctx, holder)).To(Succeed())
		Expect(expectPhase(ns, "web-7", buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(next))
		expectGrant(ns, "staging", waiter, int32(next))
		Expect(writes.injectedConflicts()).To(Equal(3))
	})
})

var _ = Describe("A restarted manager", func() {
	It("keeps the holders it finds and never grants twice", func() {
		ns := newNamespace()
		first, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{})
		Expect(err).NotTo(HaveOccurred())
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		Expect(first.Stop()).To(Succeed())

		// While no manager runs, a waiter arrives and the holder finishes.
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		setPodPhase(ns, "shop-41", corev1.PodSucceeded)

		// A new manager's first grant goes above the namespace's token
		// floor: it cannot know that nobody lowered the Lease's token.
		floor := tokenFloorOf(Default, ns)
		second, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(second.Stop()).To(Succeed()) })
		Expect(expectPhase(ns, "web-7", buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(floor + 1))
		expectPhase(ns, "shop-41", buildlockv1.PhaseReleased)
		Consistently(func(g Gomega) []string { return heldClaims(g, ns, "staging") }, "2s").Should(ConsistOf("web-7"))
	})

	It("never shows two holders while two managers decide at once", func() {
		ns := newNamespace()
		a, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(a.Stop()).To(Succeed()) })
		b, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(b.Stop()).To(Succeed()) })

		var last int64
		for i := int64(1); i <= 6; i++ {
			name := "shop-" + string(rune('a'+i))
			createClaim(ns, name, claimOpts{repo: "acme/shop", build: i, pod: name})
			got := expectPhase(ns, name, buildlockv1.PhaseHeld)
			Expect(got.Status.FencingToken).To(BeNumerically(">", last))
			last = got.Status.FencingToken
			Expect(heldClaims(Default, ns, "staging")).To(ConsistOf(name))
			setPodPhase(ns, name, corev1.PodSucceeded)
		}
	})
})

var _ = Describe("RBAC for pipelines", func() {
	It("refuses a status write from a pipeline's identity", func() {
		ns := newNamespace()
		role := &rbacRole{ns: ns}
		user := role.pipelineUser()
		bl := newClaim(ns, "shop-1", claimOpts{repo: "acme/shop", build: 1})
		Expect(user.Create(ctx, bl)).To(Succeed())
		bl.Status.Phase = buildlockv1.PhaseHeld
		bl.Status.FencingToken = 99
		err := user.Status().Update(ctx, bl)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "got %v", err)
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "buildlock-staging"}}
		Expect(apierrors.IsForbidden(user.Create(ctx, lease))).To(BeTrue())
	})
})
