package controller_test

import (
	"fmt"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// startScopedManager starts a manager that watches only the given
// namespaces, stopped when the spec ends.
func startScopedManager(o testenv.ManagerOptions, namespaces ...string) *testenv.Manager {
	GinkgoHelper()
	o.Namespaces = namespaces
	mgr, err := testenv.StartManager(ctx, cfg, o)
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { Expect(mgr.Stop()).To(Succeed()) })
	return mgr
}

// createPolicy creates the BuildLockPolicy of target staging in ns.
func createPolicy(ns string, ordering buildlockv1.Ordering) *buildlockv1.BuildLockPolicy {
	GinkgoHelper()
	p := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "staging"}}
	p.Spec.Ordering = ordering
	Expect(k8sClient.Create(ctx, p)).To(Succeed())
	return p
}

// queueOf lists the Waiting claims of target staging in the order of their
// places, as `kubectl buildlock status` shows them.
func queueOf(g Gomega, ns string) []string {
	var list buildlockv1.BuildLockList
	g.Expect(k8sClient.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
	var waiting []buildlockv1.BuildLock
	for _, bl := range list.Items {
		if bl.Status.Phase == buildlockv1.PhaseWaiting {
			g.Expect(bl.Status.QueuedAt).NotTo(BeNil(), "%s waits without a place", bl.Name)
			waiting = append(waiting, bl)
		}
	}
	slices.SortFunc(waiting, func(a, b buildlockv1.BuildLock) int { return a.Status.QueuedAt.Compare(b.Status.QueuedAt.Time) })
	names := make([]string, len(waiting))
	for i, bl := range waiting {
		names[i] = bl.Name
	}
	return names
}

// queue creates claims one after the other, each on its own line and with
// its own pod, waiting until each is Waiting, so that their places follow
// the order of the arguments.
func queue(ns string, claims ...claimOpts) {
	GinkgoHelper()
	for _, o := range claims {
		name := fmt.Sprintf("%s-%d", o.repo[len("acme/"):], o.build)
		o.pod = name
		createClaim(ns, name, o)
		expectPhase(ns, name, buildlockv1.PhaseWaiting)
	}
}

// finish ends the holder's pod and waits for next to hold.
func finish(ns, holder, next string) {
	GinkgoHelper()
	setPodPhase(ns, holder, corev1.PodSucceeded)
	expectPhase(ns, next, buildlockv1.PhaseHeld)
}

var _ = Describe("Target policies", func() {
	It("lets three apps take turns with Queue: each app's build deploys, none supersedes another", func() {
		ns := newNamespace()
		startScopedManager(testenv.ManagerOptions{}, ns)
		createPolicy(ns, buildlockv1.OrderingQueue)
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		queue(ns, claimOpts{repo: "acme/web", build: 7}, claimOpts{repo: "acme/api", build: 3})

		web := getClaim(Default, ns, "web-7")
		Expect(web.Status.Reason).To(Equal(buildlockv1.ReasonQueued))
		Expect(web.Status.Message).To(Equal("Queued for staging behind build 41 of acme/shop@main."))
		api := getClaim(Default, ns, "api-3")
		Expect(api.Status.Message).To(Equal("Queued for staging behind build 7 of acme/web@main."))
		Expect(api.Status.Holder).To(BeEmpty(), "a queued claim names no holder: it would go stale at every hand-off")

		finish(ns, "shop-41", "web-7")
		Expect(getClaim(Default, ns, "api-3").Status.Phase).To(Equal(buildlockv1.PhaseWaiting))
		finish(ns, "web-7", "api-3")
		Expect(getClaim(Default, ns, "api-3").Status.FencingToken).To(Equal(int64(3)))

		Eventually(func(g Gomega) {
			var p buildlockv1.BuildLockPolicy
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "staging"}, &p)).To(Succeed())
			ready := meta.FindStatusCondition(p.Status.Conditions, buildlockv1.ConditionReady)
			g.Expect(ready).NotTo(BeNil())
			g.Expect(ready.Status).To(Equal(metav1.ConditionTrue))
			g.Expect(ready.Message).To(ContainSubstring("follow the ordering Queue"))
		}).Should(Succeed())
	})

	It("keeps a line's place when a newer build replaces its waiting build, and sends the holder's line to the back", func() {
		ns := newNamespace()
		startScopedManager(testenv.ManagerOptions{}, ns)
		createPolicy(ns, buildlockv1.OrderingQueue)
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		queue(ns, claimOpts{repo: "acme/web", build: 7}, claimOpts{repo: "acme/api", build: 3}, claimOpts{repo: "acme/shop", build: 42})
		place := getClaim(Default, ns, "web-7").Status.QueuedAt

		createClaim(ns, "web-8", claimOpts{repo: "acme/web", build: 8, pod: "web-8"})
		Expect(expectPhase(ns, "web-7", buildlockv1.PhaseSuperseded).Status.SupersededBy).To(Equal("web-8"))
		Expect(expectPhase(ns, "web-8", buildlockv1.PhaseWaiting).Status.QueuedAt.Equal(place)).To(BeTrue(),
			"web-8 takes web-7's place")
		Eventually(func(g Gomega) []string { return queueOf(g, ns) }).Should(Equal([]string{"web-8", "api-3", "shop-42"}))

		finish(ns, "shop-41", "web-8")
		finish(ns, "web-8", "api-3")
		finish(ns, "api-3", "shop-42")
	})

	It("grants every build of a line in order with Fifo, and supersedes a late older build", func() {
		ns := newNamespace()
		startScopedManager(testenv.ManagerOptions{}, ns)
		createPolicy(ns, buildlockv1.OrderingFifo)
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		queue(ns, claimOpts{repo: "acme/shop", build: 43}, claimOpts{repo: "acme/web", build: 7}, claimOpts{repo: "acme/shop", build: 44})

		createClaim(ns, "shop-42", claimOpts{repo: "acme/shop", build: 42, pod: "shop-42"})
		late := expectPhase(ns, "shop-42", buildlockv1.PhaseSuperseded)
		Expect(late.Status.Reason).To(Equal(buildlockv1.ReasonSupersededByNewerBuild))

		finish(ns, "shop-41", "shop-43")
		finish(ns, "shop-43", "web-7")
		finish(ns, "web-7", "shop-44")
	})

	It("applies a change of ordering at once, and falls back to NewestWins when the policy is deleted", func() {
		ns := newNamespace()
		startScopedManager(testenv.ManagerOptions{}, ns)
		policy := createPolicy(ns, buildlockv1.OrderingQueue)
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		// Builds started a minute apart: docs-1 is the newest.
		started := time.Now().Add(-time.Hour)
		queue(ns, claimOpts{repo: "acme/web", build: 7, timestamp: started}, claimOpts{repo: "acme/api", build: 3, timestamp: started.Add(time.Minute)},
			claimOpts{repo: "acme/docs", build: 1, timestamp: started.Add(2 * time.Minute)})

		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(policy), policy)).To(Succeed())
		policy.Spec.Ordering = buildlockv1.OrderingFifo
		Expect(k8sClient.Update(ctx, policy)).To(Succeed())
		Consistently(func(g Gomega) []string { return queueOf(g, ns) }).WithTimeout(time.Second).
			Should(Equal([]string{"web-7", "api-3", "docs-1"}), "Queue to Fifo keeps every place")

		Expect(k8sClient.Delete(ctx, policy)).To(Succeed())
		// NewestWins keeps the newest waiting claim and supersedes the others.
		Eventually(func(g Gomega) string { return getClaim(g, ns, "docs-1").Status.Reason }).
			Should(Equal(buildlockv1.ReasonWaitingForHolder))
		Expect(expectPhase(ns, "web-7", buildlockv1.PhaseSuperseded).Status.SupersededBy).To(Equal("docs-1"))
		Expect(expectPhase(ns, "api-3", buildlockv1.PhaseSuperseded).Status.SupersededBy).To(Equal("docs-1"))
	})

	It("keeps the queue's order exactly across a manager restart, with 20 lines waiting", func() {
		ns := newNamespace()
		first, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{Namespaces: []string{ns}})
		Expect(err).NotTo(HaveOccurred())
		createPolicy(ns, buildlockv1.OrderingQueue)
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		var lines []claimOpts
		for k := range 20 {
			lines = append(lines, claimOpts{repo: fmt.Sprintf("acme/app%02d", k), build: int64(20 - k)})
		}
		queue(ns, lines...)
		var before []string
		Eventually(func(g Gomega) { before = queueOf(g, ns); g.Expect(before).To(HaveLen(20)) }).Should(Succeed())
		Expect(first.Stop()).To(Succeed())

		startScopedManager(testenv.ManagerOptions{}, ns)
		holder := "shop-41"
		for _, next := range before {
			finish(ns, holder, next)
			holder = next
		}
	})

	It("writes no more on a hand-off with 20 lines waiting than with one", func() {
		writes := newWriteCounter()
		one, twenty := newNamespace(), newNamespace()
		startScopedManager(testenv.ManagerOptions{NewClient: testenv.InterceptClient(*writes.funcs())}, one, twenty)
		handOffWrites := func(ns string, waiting int) int {
			GinkgoHelper()
			createPolicy(ns, buildlockv1.OrderingQueue)
			createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
			expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
			var lines []claimOpts
			for k := range waiting {
				lines = append(lines, claimOpts{repo: fmt.Sprintf("acme/app%02d", k), build: 1})
			}
			queue(ns, lines...)
			// Settled: nothing more is written.
			Eventually(func() int { n := writes.total(ns); time.Sleep(300 * time.Millisecond); return writes.total(ns) - n }).Should(BeZero())
			before := writes.total(ns)
			finish(ns, "shop-41", "app00-1")
			Consistently(func() int { return writes.total(ns) }).WithTimeout(time.Second).Should(Equal(writes.total(ns)))
			return writes.total(ns) - before
		}
		withOne := handOffWrites(one, 1)
		withTwenty := handOffWrites(twenty, 20)
		GinkgoWriter.Printf("Writes per hand-off: %d with 1 line waiting, %d with 20\n", withOne, withTwenty)
		Expect(withOne).To(Equal(3), "the Lease, the old holder's status and the new holder's status")
		Expect(withTwenty).To(Equal(withOne))
	})
})
