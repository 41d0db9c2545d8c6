package controller_test

import (
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	admissionv1 "k8s.io/api/admissionregistration/v1"
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

// These specs do to a lock what a person with the rights to write Leases
// (or a careless tool) can do: delete or edit its grant Lease and the
// namespace's token floor, keep a claim with a finalizer, leave a Lease of
// their own where the grant Lease goes, and flood a lock with lines
// (issue 21, items 4, 5, 6, 9 and 13).
var _ = Describe("A lock whose Leases people touch", func() {
	var writes *writeCounter

	startManager := func(o testenv.ManagerOptions, namespaces ...string) {
		GinkgoHelper()
		writes = newWriteCounter()
		o.Namespaces = namespaces
		o.NewClient = testenv.InterceptClient(*writes.funcs())
		mgr, err := testenv.StartManager(ctx, cfg, o)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(mgr.Stop()).To(Succeed()) })
	}
	deleteLease := func(ns, name string) {
		GinkgoHelper()
		Expect(k8sClient.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})).To(Succeed())
	}
	editLease := func(ns, target string, edit func(*coordinationv1.Lease)) {
		GinkgoHelper()
		Eventually(func() error {
			lease := getLease(Default, ns, target)
			edit(lease)
			return k8sClient.Update(ctx, lease)
		}).Should(Succeed())
	}
	// holdInTurn makes claims of the given builds of acme/shop hold one after
	// another (each deleted once it holds), and returns the last token.
	holdInTurn := func(ns string, builds ...int64) int64 {
		GinkgoHelper()
		var token int64
		for _, b := range builds {
			name := fmt.Sprintf("shop-%d", b)
			createClaim(ns, name, claimOpts{repo: "acme/shop", build: b, pod: name})
			token = expectPhase(ns, name, buildlockv1.PhaseHeld).Status.FencingToken
			Expect(k8sClient.Delete(ctx, getClaim(Default, ns, name))).To(Succeed())
			Eventually(func(g Gomega) { g.Expect(getLease(g, ns, "staging").Spec.HolderIdentity).To(BeNil()) }).Should(Succeed())
		}
		return token
	}

	// tokenFloor waits for the namespace's token floor and returns it.
	tokenFloor := func(ns string) int64 {
		GinkgoHelper()
		var token int64
		Eventually(func(g Gomega) {
			var floor coordinationv1.Lease
			g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "buildlock.token-floor"}, &floor)).To(Succeed())
			g.Expect(floor.Spec.LeaseTransitions).NotTo(BeNil())
			token = int64(*floor.Spec.LeaseTransitions)
		}).Should(Succeed())
		return token
	}

	It("recreates a deleted grant Lease at once, as the same hold, and hands it on with the next token", func() {
		ns := newNamespace()
		startManager(testenv.ManagerOptions{}, ns)
		holder := createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectGrant(ns, "staging", holder, 1)
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		expectPhase(ns, "web-7", buildlockv1.PhaseWaiting)
		acquired := expectPhase(ns, "shop-41", buildlockv1.PhaseHeld).Status.AcquiredAt

		deleteLease(ns, "buildlock-staging")
		// No other event: the Lease's delete is what brings the lock back.
		Eventually(func(g Gomega) {
			lease := getLease(g, ns, "staging")
			g.Expect(lease.Spec.HolderIdentity).To(HaveValue(Equal(fmt.Sprintf("shop-41/%s", holder.UID))))
			g.Expect(lease.Spec.LeaseTransitions).To(HaveValue(Equal(int32(1))))
			g.Expect(lease.Spec.AcquireTime.Time).To(BeTemporally("==", acquired.Time))
		}).Should(Succeed())
		Consistently(func(g Gomega) {
			g.Expect(getClaim(g, ns, "shop-41").Status.Phase).To(Equal(buildlockv1.PhaseHeld))
			g.Expect(getClaim(g, ns, "web-7").Status.Phase).To(Equal(buildlockv1.PhaseWaiting))
		}, "1s").Should(Succeed())

		// The hand-off goes above the namespace's floor: a missing Lease may
		// have issued every token up to it.
		floor := tokenFloor(ns)
		setPodPhase(ns, "shop-41", corev1.PodSucceeded)
		Expect(expectPhase(ns, "web-7", buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(floor + 1))
		Expect(expectPhase(ns, "shop-41", buildlockv1.PhaseReleased).Status.Reason).To(Equal(buildlockv1.ReasonPodFinished))
	})

	It("never repeats a token after a free grant Lease is deleted", func() {
		ns := newNamespace()
		startManager(testenv.ManagerOptions{}, ns)
		Expect(holdInTurn(ns, 1, 2, 3)).To(Equal(int64(3)))
		deleteLease(ns, "buildlock-staging")
		floor := tokenFloor(ns)
		Expect(floor).To(BeNumerically(">=", 3), "the namespace's floor holds every token issued")
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		Expect(expectPhase(ns, "web-7", buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(floor + 1))
	})

	// Bug 10 of docs/reliability.md: nothing but the Lease and the holder's
	// claim showed the lock's tokens, and a restart forgets what a manager
	// saw; the namespace's floor, raised ahead of the grants, still holds
	// them.
	It("never repeats a token after a held lock's Lease and its holder's claim are deleted while no manager runs", func() {
		ns := newNamespace()
		first, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{Namespaces: []string{ns}})
		Expect(err).NotTo(HaveOccurred())
		Expect(holdInTurn(ns, 1, 2)).To(Equal(int64(2)))
		createClaim(ns, "shop-3", claimOpts{repo: "acme/shop", build: 3, pod: "shop-3"})
		Expect(expectPhase(ns, "shop-3", buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(int64(3)))
		Expect(first.Stop()).To(Succeed())

		deleteLease(ns, "buildlock-staging")
		Expect(k8sClient.Delete(ctx, getClaim(Default, ns, "shop-3"))).To(Succeed())
		startManager(testenv.ManagerOptions{}, ns)
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		Expect(expectPhase(ns, "web-7", buildlockv1.PhaseHeld).Status.FencingToken).To(BeNumerically(">", 3))
	})

	It("restores a deleted token floor, and never repeats a token", func() {
		ns := newNamespace()
		startManager(testenv.ManagerOptions{GrantRetention: 2 * time.Second}, ns)
		Expect(holdInTurn(ns, 1, 2)).To(Equal(int64(2)))
		// The operator lets the idle Lease go, keeping its token in the floor;
		// then someone deletes the floor.
		Eventually(func(g Gomega) {
			err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "buildlock-staging"}, &coordinationv1.Lease{})
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%v", err)
		}).Should(Succeed())
		before := tokenFloor(ns)
		deleteLease(ns, "buildlock.token-floor")
		Eventually(func(g Gomega) {
			var floor coordinationv1.Lease
			g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "buildlock.token-floor"}, &floor)).To(Succeed())
			g.Expect(floor.Spec.LeaseTransitions).To(HaveValue(Equal(int32(before))))
		}).Should(Succeed())
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		Expect(expectPhase(ns, "web-7", buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(before + 1))
	})

	It("keeps the line memory the claims show when the grant Lease is deleted", func() {
		ns := newNamespace()
		startManager(testenv.ManagerOptions{}, ns)
		createClaim(ns, "shop-10", claimOpts{repo: "acme/shop", build: 10, pod: "shop-10"})
		expectPhase(ns, "shop-10", buildlockv1.PhaseHeld)
		setPodPhase(ns, "shop-10", corev1.PodSucceeded)
		expectPhase(ns, "shop-10", buildlockv1.PhaseReleased)
		deleteLease(ns, "buildlock-staging")
		Eventually(func(g Gomega) {
			g.Expect(getLease(g, ns, "staging").Annotations).To(HaveKeyWithValue("buildlock.io/lines", ContainSubstring(`"build":10`)))
		}).Should(Succeed())

		createClaim(ns, "shop-9", claimOpts{repo: "acme/shop", build: 9, pod: "shop-9"})
		Expect(expectPhase(ns, "shop-9", buildlockv1.PhaseSuperseded).Status.Message).To(ContainSubstring("Build 10 of acme/shop@main already deployed: it held staging"))
		Expect(expectPhase(ns, "shop-10", buildlockv1.PhaseReleased).Status.FencingToken).To(Equal(int64(1)))
	})

	It("repairs an edited writer at once", func() {
		ns := newNamespace()
		startManager(testenv.ManagerOptions{}, ns)
		pod := createPod(ns, "shop-41")
		bl := newClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41})
		bl.Spec.PodRef = &buildlockv1.PodReference{Name: pod.Name, UID: string(pod.UID)}
		Expect(k8sClient.Create(ctx, bl)).To(Succeed())
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		Eventually(func(g Gomega) {
			g.Expect(getLease(g, ns, "staging").Annotations).To(HaveKeyWithValue("buildlock.io/writer-pod-uid", string(pod.UID)))
		}).Should(Succeed())

		editLease(ns, "staging", func(l *coordinationv1.Lease) {
			l.Annotations["buildlock.io/writer-pod-uid"] = "6a1f9c4e-0000-4000-8000-000000000000" // another pod
		})
		Eventually(func(g Gomega) {
			g.Expect(getLease(g, ns, "staging").Annotations).To(HaveKeyWithValue("buildlock.io/writer-pod-uid", string(pod.UID)))
		}).Should(Succeed())
	})

	DescribeTable("names the holder again when its grant Lease is edited",
		func(edit func(l *coordinationv1.Lease, waiter *buildlockv1.BuildLock)) {
			ns := newNamespace()
			startManager(testenv.ManagerOptions{}, ns)
			holder := createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
			expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
			waiter := createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
			expectPhase(ns, "web-7", buildlockv1.PhaseWaiting)

			editLease(ns, "staging", func(l *coordinationv1.Lease) { edit(l, waiter) })
			expectGrant(ns, "staging", holder, 1)
			poke(ns, "web-7")
			Consistently(func(g Gomega) {
				g.Expect(getClaim(g, ns, "shop-41").Status.Phase).To(Equal(buildlockv1.PhaseHeld))
				g.Expect(getClaim(g, ns, "web-7").Status.Phase).To(Equal(buildlockv1.PhaseWaiting))
				g.Expect(getLease(g, ns, "staging").Spec.HolderIdentity).To(HaveValue(Equal(fmt.Sprintf("shop-41/%s", holder.UID))))
			}, "1s").Should(Succeed())
			// The hand-off goes on above the namespace's floor (the edit was
			// somebody else's: it may have lowered a token this manager
			// never saw): none repeats.
			floor := tokenFloor(ns)
			setPodPhase(ns, "shop-41", corev1.PodSucceeded)
			Expect(expectPhase(ns, "web-7", buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(floor + 1))
		},
		Entry("to name the waiter", func(l *coordinationv1.Lease, waiter *buildlockv1.BuildLock) {
			l.Spec.HolderIdentity = ptr.To(fmt.Sprintf("web-7/%s", waiter.UID))
		}),
		Entry("to name nobody", func(l *coordinationv1.Lease, _ *buildlockv1.BuildLock) {
			l.Spec.HolderIdentity, l.Spec.AcquireTime = nil, nil
		}),
		Entry("with its token lowered", func(l *coordinationv1.Lease, _ *buildlockv1.BuildLock) {
			l.Spec.LeaseTransitions = ptr.To(int32(0))
		}),
	)

	It("ends a claim a finalizer keeps after its delete, and hands the lock on", func() {
		ns := newNamespace()
		startManager(testenv.ManagerOptions{}, ns)
		bl := newClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		bl.Finalizers = []string{"test.buildlock.io/keep"}
		createPod(ns, "shop-41")
		Expect(k8sClient.Create(ctx, bl)).To(Succeed())
		DeferCleanup(func() {
			patch := []byte(`{"metadata":{"finalizers":null}}`)
			err := k8sClient.Patch(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "shop-41"}}, client.RawPatch(types.MergePatchType, patch))
			Expect(client.IgnoreNotFound(err)).To(Succeed())
		})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		waiter := createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		expectPhase(ns, "web-7", buildlockv1.PhaseWaiting)

		Expect(k8sClient.Delete(ctx, getClaim(Default, ns, "shop-41"))).To(Succeed())
		gone := expectPhase(ns, "shop-41", buildlockv1.PhaseReleased)
		Expect(gone.DeletionTimestamp).NotTo(BeNil())
		Expect(gone.Status.Reason).To(Equal(buildlockv1.ReasonDeleted))
		Expect(expectPhase(ns, "web-7", buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(int64(2)))
		expectGrant(ns, "staging", waiter, 2)
	})

	It("refuses a Lease of someone else's where the grant Lease goes, without a hot loop", func() {
		ns := newNamespace()
		startManager(testenv.ManagerOptions{}, ns)
		theirs := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "buildlock-staging", Labels: map[string]string{"app": "another-tool"}},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("another-tool"), LeaseTransitions: ptr.To(int32(5))},
		}
		Expect(k8sClient.Create(ctx, theirs)).To(Succeed())

		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		Eventually(func(g Gomega) {
			bl := getClaim(g, ns, "shop-41")
			g.Expect(bl.Status.Phase).To(Equal(buildlockv1.PhasePending))
			g.Expect(bl.Status.Reason).To(Equal(buildlockv1.ReasonForeignLease))
			g.Expect(bl.Status.Message).To(ContainSubstring("Lease " + ns + "/buildlock-staging exists but was not created by buildlock"))
		}).Should(Succeed())
		before := writes.total(ns)
		Consistently(func(g Gomega) {
			lease := getLease(g, ns, "staging")
			g.Expect(lease.Spec.HolderIdentity).To(HaveValue(Equal("another-tool")), "never taken over")
			g.Expect(lease.Labels).NotTo(HaveKey("app.kubernetes.io/managed-by"))
		}, "2s").Should(Succeed())
		Expect(writes.total(ns)-before).To(BeNumerically("<=", 1), "no hot retry loop")

		// Once it is gone, the lock is granted (on the next event, or the
		// minute's recheck).
		deleteLease(ns, "buildlock-staging")
		poke(ns, "shop-41")
		held := expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		Expect(held.Status.FencingToken).To(BeNumerically("<=", tokenFloor(ns)), "the namespace's floor holds the token")
		expectGrant(ns, "staging", held, int32(held.Status.FencingToken))
	})

	It("keeps a line's memory however many lines one pipeline floods it with", func() {
		ns := newNamespace()
		startManager(testenv.ManagerOptions{}, ns)
		intruder := identity{user: "system:serviceaccount:" + ns + ":intruder"}
		grantAll(ns, intruder.user)
		createClaim(ns, "shop-10", claimOpts{repo: "acme/shop", build: 10, pod: "shop-10"})
		expectPhase(ns, "shop-10", buildlockv1.PhaseHeld)
		Expect(k8sClient.Delete(ctx, getClaim(Default, ns, "shop-10"))).To(Succeed())

		// 70 fake lines, each held for a moment: more than the 64 lines the
		// operator used to keep, most recent first.
		fakes := intruder.client()
		branch := strings.Repeat("b", 200)
		// A fake line that the memory (the intruder's share of it, once its
		// identity counts as verified) has no room for waits instead
		// (issue 31): it is never granted unremembered.
		for k := range 70 {
			name := fmt.Sprintf("fake-%02d", k)
			bl := newClaim(ns, name, claimOpts{repo: fmt.Sprintf("fake/app-%02d", k), branch: branch, build: 1})
			Expect(fakes.Create(ctx, bl)).To(Succeed())
			Eventually(func(g Gomega) {
				got := getClaim(g, ns, name)
				g.Expect(got.Status.Phase == buildlockv1.PhaseHeld || got.Status.Reason == buildlockv1.ReasonLineMemoryFull).To(BeTrue(), "%s is %s", name, got.Status.Phase)
			}).Should(Succeed())
			Expect(fakes.Delete(ctx, bl)).To(Succeed())
		}
		createClaim(ns, "shop-9", claimOpts{repo: "acme/shop", build: 9, pod: "shop-9"})
		Expect(expectPhase(ns, "shop-9", buildlockv1.PhaseSuperseded).Status.Reason).To(Equal(buildlockv1.ReasonSupersededByNewerBuild))
		Expect(len(getLease(Default, ns, "staging").Annotations["buildlock.io/lines"])).To(BeNumerically("<", 128<<10))
	})
})

// Lines belong to the service account that holds them (issue 21, item 9),
// once spec.requester is the API server's word.
var _ = Describe("Lines and identities", func() {
	It("refuses another pipeline's claim of a line, whatever its build, and bounds a jump", func() {
		ns := newNamespace()
		mgr, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{Namespaces: []string{ns}, RequesterSettle: time.Nanosecond})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(mgr.Stop()).To(Succeed()) })
		shop := identity{user: "system:serviceaccount:" + ns + ":shop"}
		intruder := identity{user: "system:serviceaccount:" + ns + ":intruder"}
		grantAll(ns, shop.user)
		grantAll(ns, intruder.user)
		claimAs := func(id identity, name string, build int64) {
			GinkgoHelper()
			Expect(id.client().Create(ctx, newClaim(ns, name, claimOpts{repo: "acme/shop", build: build}))).To(Succeed())
		}
		// The requester policy was installed before the suite's specs; a
		// claim created in the same second would not count as after it.
		var policy admissionv1.MutatingAdmissionPolicy
		Expect(k8sClient.Get(ctx, types.NamespacedName{Name: "buildlock-requester"}, &policy)).To(Succeed())
		time.Sleep(time.Until(policy.CreationTimestamp.Add(2 * time.Second)))

		claimAs(shop, "shop-42", 42)
		expectPhase(ns, "shop-42", buildlockv1.PhaseHeld)
		Expect(shop.client().Delete(ctx, getClaim(Default, ns, "shop-42"))).To(Succeed())

		claimAs(intruder, "evil", buildlockv1.MaxBuild)
		evil := expectPhase(ns, "evil", buildlockv1.PhaseSuperseded)
		Expect(evil.Status.Reason).To(Equal(buildlockv1.ReasonLineOwnedByOther))
		Expect(evil.Status.Message).To(ContainSubstring("its branch acme/shop@main belongs to " + shop.user))

		claimAs(shop, "shop-far", 42+buildlockv1.DefaultMaxBuildJump+1)
		Expect(expectPhase(ns, "shop-far", buildlockv1.PhaseSuperseded).Status.Reason).To(Equal(buildlockv1.ReasonBuildJumpTooLarge))

		claimAs(shop, "shop-43", 43)
		Expect(expectPhase(ns, "shop-43", buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(int64(2)))
		Expect(getLease(Default, ns, "staging").Annotations["buildlock.io/lines"]).To(ContainSubstring(`"owner":"` + shop.user + `"`))
	})
})
