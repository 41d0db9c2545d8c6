package controller_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// oneOff is a one-off window of kind from start to end.
func oneOff(kind buildlockv1.WindowKind, name, reason string, start, end time.Time) buildlockv1.Window {
	return buildlockv1.Window{Kind: kind, Name: name, Reason: reason,
		Start: buildlockv1.NewTimestamp(start), End: buildlockv1.NewTimestamp(end)}
}

// setWindows creates or replaces the windows of target staging's policy in
// ns (ordering as given when it creates it).
func setWindows(ns string, ordering buildlockv1.Ordering, windows ...buildlockv1.Window) {
	GinkgoHelper()
	var p buildlockv1.BuildLockPolicy
	err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "staging"}, &p)
	if err != nil {
		p = buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "staging"}}
		p.Spec.Ordering, p.Spec.Windows = ordering, windows
		Expect(k8sClient.Create(ctx, &p)).To(Succeed())
		return
	}
	p.Spec.Windows = windows
	Expect(k8sClient.Update(ctx, &p)).To(Succeed())
}

func getPolicy(g Gomega, ns string) *buildlockv1.BuildLockPolicy {
	var p buildlockv1.BuildLockPolicy
	g.Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "staging"}, &p)).To(Succeed())
	return &p
}

// expectFrozen waits until the claim waits with reason Frozen, and returns it.
func expectFrozen(ns, name string) *buildlockv1.BuildLock {
	GinkgoHelper()
	var bl *buildlockv1.BuildLock
	Eventually(func(g Gomega) {
		bl = getClaim(g, ns, name)
		g.Expect(bl.Status.Phase).To(Equal(buildlockv1.PhaseWaiting), "message %q", bl.Status.Message)
		g.Expect(bl.Status.Reason).To(Equal(buildlockv1.ReasonFrozen), "message %q", bl.Status.Message)
	}).Should(Succeed())
	return bl
}

// override lets claim name through a freeze as user, until expires.
func override(cl client.Client, ns, name, reason string, expires time.Time) error {
	bl := &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:%q}}}`, buildlockv1.OverrideAnnotation, reason,
		buildlockv1.OverrideExpiresAnnotation, expires.UTC().Format(time.RFC3339))
	return cl.Patch(ctx, bl, client.RawPatch(types.MergePatchType, []byte(patch)))
}

var _ = Describe("Deploy windows", func() {
	It("lets the holder at a freeze's start finish, and the next build waits, Frozen, with the window's reason", func() {
		ns := newNamespace()
		startScopedManager(testenv.ManagerOptions{}, ns)
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)

		berlin, err := time.LoadLocation("Europe/Berlin")
		Expect(err).NotTo(HaveOccurred())
		end := time.Now().Add(2 * time.Hour).Truncate(time.Second)
		w := oneOff(buildlockv1.WindowDeny, "holiday", "holiday freeze", time.Now().Add(-time.Minute), end)
		w.TimeZone = "Europe/Berlin"
		setWindows(ns, buildlockv1.OrderingQueue, w)
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		web := expectFrozen(ns, "web-7")
		Expect(web.Status.Message).To(Equal(fmt.Sprintf("staging is frozen until %s (holiday freeze); this build keeps its place",
			end.In(berlin).Format(time.RFC3339))))
		Expect(getClaim(Default, ns, "shop-41").Status.Phase).To(Equal(buildlockv1.PhaseHeld), "a freeze pre-empts nobody")

		Eventually(func(g Gomega) {
			p := getPolicy(g, ns)
			g.Expect(p.Status.State).To(Equal(buildlockv1.WindowStateFrozen))
			g.Expect(p.Status.ActiveWindows).To(HaveLen(1))
			g.Expect(p.Status.ActiveWindows[0].Name).To(Equal("holiday"))
			g.Expect(p.Status.ActiveWindows[0].Reason).To(Equal("holiday freeze"))
			g.Expect(p.Status.NextChange).NotTo(BeNil())
			g.Expect(p.Status.NextChange.Time).To(BeTemporally("==", end))
			g.Expect(eventReasons(g, ns, "staging")).To(ContainElement(buildlockv1.ReasonFreezeBegan))
		}).Should(Succeed())

		By("the holder finishes: nobody is granted while the target is frozen")
		setPodPhase(ns, "shop-41", corev1.PodSucceeded)
		expectPhase(ns, "shop-41", buildlockv1.PhaseReleased)
		Consistently(func(g Gomega) {
			g.Expect(heldClaims(g, ns, "staging")).To(BeEmpty())
			g.Expect(getClaim(g, ns, "web-7").Status.Reason).To(Equal(buildlockv1.ReasonFrozen))
		}).WithTimeout(2 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
	})

	It("releases the holder at the freeze's start when the window says holder: Release", func() {
		ns := newNamespace()
		startScopedManager(testenv.ManagerOptions{}, ns)
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		w := oneOff(buildlockv1.WindowDeny, "incident", "incident 4711", time.Now().Add(time.Second), time.Now().Add(time.Hour))
		w.Holder = buildlockv1.WindowHolderRelease
		setWindows(ns, "", w)
		shop := expectPhase(ns, "shop-41", buildlockv1.PhaseReleased)
		Expect(shop.Status.Reason).To(Equal(buildlockv1.ReasonFreezeStarted))
		Expect(shop.Status.Message).To(ContainSubstring("incident 4711"))
	})

	It("grants the waiting claims at the freeze's end, at once and in the ordering's order, without a poke", func() {
		ns := newNamespace()
		startScopedManager(testenv.ManagerOptions{}, ns)
		// The edge is a few seconds ahead in real time: the lock is granted
		// there because the operator requeued for it, not because anything
		// about the lock changed.
		end := time.Now().Add(4 * time.Second).Truncate(time.Second)
		setWindows(ns, buildlockv1.OrderingFifo, oneOff(buildlockv1.WindowDeny, "", "release train", time.Now().Add(-time.Minute), end))
		for _, name := range []string{"web-7", "api-3"} {
			createClaim(ns, name, claimOpts{repo: "acme/" + name[:3], build: 7, pod: name})
			expectFrozen(ns, name)
		}
		Expect(getClaim(Default, ns, "web-7").Status.Message).To(ContainSubstring("(release train)"))
		Eventually(func(g Gomega) {
			g.Expect(heldClaims(g, ns, "staging")).To(Equal([]string{"web-7"}))
			g.Expect(getClaim(g, ns, "api-3").Status.Reason).To(Equal(buildlockv1.ReasonQueued))
			g.Expect(getPolicy(g, ns).Status.State).To(Equal(buildlockv1.WindowStateOpen))
			g.Expect(eventReasons(g, ns, "staging")).To(ContainElement(buildlockv1.ReasonFreezeEnded))
		}).Should(Succeed())
	})

	It("closes the target outside every Allow window, and opens it inside one", func() {
		ns := newNamespace()
		clock := &offsetClock{}
		startScopedManager(testenv.ManagerOptions{Clock: clock}, ns)
		// Weekdays 09:00 to 17:00 in New York, read on the manager's clock.
		setWindows(ns, "", buildlockv1.Window{Kind: buildlockv1.WindowAllow, Name: "office-hours", Schedule: "0 9 * * 1-5",
			Duration: &metav1.Duration{Duration: 8 * time.Hour}, TimeZone: "America/New_York"})
		ny, err := time.LoadLocation("America/New_York")
		Expect(err).NotTo(HaveOccurred())
		// Move the manager's clock to the coming Saturday, noon in New York.
		now := time.Now().In(ny)
		saturday := time.Date(now.Year(), now.Month(), now.Day()+int(time.Saturday-now.Weekday()+7)%7, 12, 0, 0, 0, ny)
		clock.advance(time.Until(saturday))
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		web := expectFrozen(ns, "web-7")
		Expect(web.Status.Message).To(ContainSubstring("outside its Allow windows"))
		Expect(web.Status.Message).To(ContainSubstring("T09:00:00-0"), "opens Monday 09:00 New York time")

		By("Monday 10:00 in New York, the target is open")
		clock.advance(46 * time.Hour)
		poke(ns, "web-7")
		expectPhase(ns, "web-7", buildlockv1.PhaseHeld)
	})

	It("grants a claim a person overrode through a freeze, once, and records who and why", func() {
		ns := newNamespace()
		person := identity{user: "alice@example.com"}
		grantAll(ns, person.user)
		startScopedManager(testenv.ManagerOptions{}, ns)
		setWindows(ns, buildlockv1.OrderingQueue, oneOff(buildlockv1.WindowDeny, "holiday", "holiday freeze", time.Now().Add(-time.Minute), time.Now().Add(time.Hour)))
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectFrozen(ns, "web-7")
		expectFrozen(ns, "shop-41")

		By("an override that has expired does not apply")
		Expect(override(person.client(), ns, "shop-41", "hotfix for incident 4711", time.Now().Add(-time.Minute))).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(getClaim(g, ns, "shop-41").Status.Message).To(ContainSubstring("expired"))
		}).Should(Succeed())

		By("an override in effect goes through the freeze, ahead of the queue the freeze holds back")
		Expect(override(person.client(), ns, "shop-41", "hotfix for incident 4711", time.Now().Add(30*time.Minute))).To(Succeed())
		shop := expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		Expect(shop.Annotations).To(HaveKeyWithValue(buildlockv1.OverriddenByAnnotation, person.user), "stamped by the API server")
		Expect(shop.Status.Message).To(ContainSubstring(`overridden by "alice@example.com" ("hotfix for incident 4711")`))
		Eventually(func(g Gomega) {
			g.Expect(eventReasons(g, ns, "shop-41")).To(ContainElement(buildlockv1.ReasonOverridden))
		}).Should(Succeed())
		Expect(getClaim(Default, ns, "web-7").Status.Reason).To(Equal(buildlockv1.ReasonFrozen))

		By("the override is used up by its grant: the next build waits for the freeze to end")
		setPodPhase(ns, "shop-41", corev1.PodSucceeded)
		expectPhase(ns, "shop-41", buildlockv1.PhaseReleased)
		Consistently(func(g Gomega) {
			g.Expect(heldClaims(g, ns, "staging")).To(BeEmpty())
		}).WithTimeout(2 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
	})

	It("refuses a pipeline's override and a pipeline's freeze, and a forged overridden-by", func() {
		ns := newNamespace()
		pipeline := identity{user: "system:serviceaccount:" + ns + ":pipeline"}
		grantAll(ns, pipeline.user)
		grantAll(ns, "bob")
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7})
		Expect(override(pipeline.client(), ns, "web-7", "let me through", time.Now().Add(time.Minute))).
			To(beRefusedWith("Overriding a freeze is for people"))

		// A CI identity (an OIDC token that names its repository) is a pipeline too.
		ciCfg := identity{user: "github:acme/web"}.config()
		ciCfg.Impersonate.Extra = map[string][]string{"buildlock.io/repository": {"acme/web"}}
		grantAll(ns, "github:acme/web")
		ci, err := client.New(ciCfg, client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())
		Expect(override(ci, ns, "web-7", "let me through", time.Now().Add(time.Minute))).
			To(beRefusedWith("Overriding a freeze is for people"))

		bl := &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-7"}}
		forged := fmt.Sprintf(`{"metadata":{"annotations":{%q:"alice@example.com"}}}`, buildlockv1.OverriddenByAnnotation)
		Expect(identity{user: "bob"}.client().Patch(ctx, bl, client.RawPatch(types.MergePatchType, []byte(forged)))).
			To(beRefusedWith("stamped by the API server"))

		freeze := oneOff(buildlockv1.WindowDeny, "freeze-1", "mine", time.Now(), time.Now().Add(time.Hour))
		freeze.FrozenBy = pipeline.user
		p := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "staging"}}
		p.Spec.Windows = []buildlockv1.Window{freeze}
		Expect(pipeline.client().Create(ctx, p)).To(beRefusedWith("Freezing a target is for people"))
		freeze.FrozenBy = "alice@example.com"
		p.Spec.Windows = []buildlockv1.Window{freeze}
		Expect(identity{user: "bob"}.client().Create(ctx, p)).To(beRefusedWith("set frozenBy to bob"))
	})

	It("keeps a frozen target frozen across a manager restart: nothing granted, the order kept", func() {
		ns := newNamespace()
		mgr := startScopedManager(testenv.ManagerOptions{}, ns)
		setWindows(ns, buildlockv1.OrderingQueue, oneOff(buildlockv1.WindowDeny, "holiday", "holiday freeze", time.Now().Add(-time.Minute), time.Now().Add(time.Hour)))
		for _, name := range []string{"web-7", "api-3", "shop-4"} {
			createClaim(ns, name, claimOpts{repo: "acme/" + name[:len(name)-2], build: 7, pod: name})
			expectFrozen(ns, name)
		}
		order := queueOf(Default, ns)
		Expect(mgr.Stop()).To(Succeed())
		startScopedManager(testenv.ManagerOptions{}, ns)
		poke(ns, "shop-4")
		Consistently(func(g Gomega) {
			g.Expect(heldClaims(g, ns, "staging")).To(BeEmpty())
			g.Expect(queueOf(g, ns)).To(Equal(order))
		}).WithTimeout(2 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())

		By("the freeze is lifted: the first in the queue is granted")
		setWindows(ns, "", oneOff(buildlockv1.WindowDeny, "holiday", "holiday freeze", time.Now().Add(-time.Hour), time.Now().Add(-time.Minute)))
		expectPhase(ns, order[0], buildlockv1.PhaseHeld)
	})
})

var _ = Describe("An enforced freeze", func() {
	It("refuses a pipeline's write into the frozen target, saying until when and why, and admits a person's", func() {
		ci := newNamespace()
		target := "stg-" + ci[len("bl-"):]
		namespaceNamed(target, map[string]string{buildlockv1.LockedByLabel: ci})
		pipeline := "system:serviceaccount:" + ci + ":pipeline"
		person := identity{user: "alice"}
		for _, ns := range []string{ci, target} {
			grantAll(ns, pipeline)
			grantAll(ns, person.user)
		}
		shop := createPod(ci, "shop-41")
		startScopedManager(testenv.ManagerOptions{}, ci)
		end := time.Now().Add(2 * time.Hour).Truncate(time.Second)
		policy := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ci, Name: target}}
		policy.Spec.Enforce = &buildlockv1.Enforcement{ServiceAccounts: []string{"pipeline"}}
		policy.Spec.Windows = []buildlockv1.Window{oneOff(buildlockv1.WindowDeny, "holiday", "holiday freeze", time.Now().Add(-time.Minute), end)}
		Expect(k8sClient.Create(ctx, policy)).To(Succeed())

		bl := newClaim(ci, "shop-41", claimOpts{target: target, repo: "acme/shop", build: 41})
		bl.Spec.PodRef = &buildlockv1.PodReference{Name: shop.Name, UID: string(shop.UID)}
		Expect(identity{user: pipeline, pod: shop}.client().Create(ctx, bl)).To(Succeed())
		expectFrozen(ci, "shop-41")

		until := end.UTC().Format(time.RFC3339)
		Eventually(func() error { return deploy(identity{user: pipeline, pod: shop}, target, "during-freeze") }).
			Should(beRefusedWith("namespace "+target+" is frozen until "+until+" (holiday freeze)", "kubectl buildlock override -n "+ci))
		Expect(deploy(person, target, "from-alice")).To(Succeed(), "a person's writes stay admitted")
	})
})
