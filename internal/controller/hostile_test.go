package controller_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// These specs send what a pipeline (or a person with a YAML typo, or a
// client whose clock is off) can send, and check that the lock stays a lock.
var _ = Describe("Ordinary and hostile inputs", func() {
	// startManager starts a manager scoped to the given namespaces.
	startManager := func(o testenv.ManagerOptions, namespaces ...string) {
		GinkgoHelper()
		o.Namespaces = namespaces
		mgr, err := testenv.StartManager(ctx, cfg, o)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(mgr.Stop()).To(Succeed()) })
	}

	// createRaw creates a BuildLock from raw fields, as kubectl apply would:
	// the Go types cannot write a timestamp without its microseconds.
	createRaw := func(ns, name string, spec map[string]any) {
		GinkgoHelper()
		u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
		u.SetGroupVersionKind(buildlockv1.GroupVersion.WithKind("BuildLock"))
		u.SetNamespace(ns)
		u.SetName(name)
		Expect(k8sClient.Create(ctx, u)).To(Succeed())
	}

	patchSpec := func(ns, name, patch string) {
		GinkgoHelper()
		bl := &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		Expect(k8sClient.Patch(ctx, bl, client.RawPatch(types.MergePatchType, []byte(patch)))).To(Succeed())
	}

	It("decides every lock although a claim's times are written without microseconds or with an offset", func() {
		plain, other := newNamespace(), newNamespace()
		startManager(testenv.ManagerOptions{}, plain, other)
		createRaw(plain, "hand-written", map[string]any{
			"target": "staging", "repo": "acme/shop", "branch": "main", "build": int64(1),
			"timestamp": "2026-11-30T22:45:00Z", "renewTime": "2026-12-01T12:45:00+14:00", "expiresAfter": "30m",
		})
		createClaim(other, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		expectPhase(other, "web-7", buildlockv1.PhaseHeld)
		expectPhase(plain, "hand-written", buildlockv1.PhaseHeld)
		createRaw(plain, "from-javascript", map[string]any{
			"target": "staging", "repo": "acme/web", "branch": "main", "build": int64(2), "timestamp": "2026-11-30T22:46:00.123Z",
		})
		expectPhase(plain, "from-javascript", buildlockv1.PhaseWaiting)
	})

	It("counts a renewal stamped in year 9999 from when the operator saw it", func() {
		ns := newNamespace()
		clock := &offsetClock{}
		startManager(testenv.ManagerOptions{Clock: clock}, ns)
		createClaim(ns, "nopod-1", claimOpts{repo: "acme/shop", build: 1, expiresAfter: 10 * time.Second})
		expectPhase(ns, "nopod-1", buildlockv1.PhaseHeld)
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		expectPhase(ns, "web-7", buildlockv1.PhaseWaiting)

		patchSpec(ns, "nopod-1", `{"spec":{"renewTime":"9999-01-01T00:00:00Z"}}`)
		Eventually(func(g Gomega) {
			bl := getClaim(g, ns, "nopod-1")
			g.Expect(bl.Status.RenewedAt).NotTo(BeNil())
			g.Expect(bl.Status.RenewedAt.Time).To(BeTemporally("~", clock.Now(), 5*time.Second))
			g.Expect(bl.Status.ExpiresAt.Time).To(BeTemporally("<", clock.Now().Add(11*time.Second)))
		}).WithTimeout(5 * time.Second).Should(Succeed())

		clock.advance(11 * time.Second)
		poke(ns, "nopod-1")
		Eventually(func(g Gomega) {
			bl := getClaim(g, ns, "nopod-1")
			g.Expect(bl.Status.Phase).To(Equal(buildlockv1.PhaseExpired))
			g.Expect(bl.Status.Reason).To(Equal(buildlockv1.ReasonExpired))
		}).WithTimeout(5 * time.Second).Should(Succeed())
		expectPhase(ns, "web-7", buildlockv1.PhaseHeld)
	})

	It("ends a pod-less hold that keeps renewing at --max-hold", func() {
		ns := newNamespace()
		clock := &offsetClock{}
		startManager(testenv.ManagerOptions{Clock: clock, MaxHold: time.Minute}, ns)
		createClaim(ns, "nopod-1", claimOpts{repo: "acme/shop", build: 1, expiresAfter: 30 * time.Second})
		expectPhase(ns, "nopod-1", buildlockv1.PhaseHeld)
		for range 3 {
			clock.advance(20 * time.Second)
			patchSpec(ns, "nopod-1", fmt.Sprintf(`{"spec":{"renewTime":%q}}`, clock.Now().UTC().Format(time.RFC3339Nano)))
		}
		clock.advance(time.Second)
		poke(ns, "nopod-1")
		Eventually(func(g Gomega) {
			bl := getClaim(g, ns, "nopod-1")
			g.Expect(bl.Status.Phase).To(Equal(buildlockv1.PhaseExpired))
			g.Expect(bl.Status.Reason).To(Equal(buildlockv1.ReasonMaxHoldExceeded))
		}).WithTimeout(5 * time.Second).Should(Succeed())
	})

	It("ranks a claim stamped in year 9999 no newer than its creation allows", func() {
		ns := newNamespace()
		startManager(testenv.ManagerOptions{}, ns)
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		createClaim(ns, "evil-1", claimOpts{repo: "evil/repo", build: 1, pod: "evil-1",
			timestamp: time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)})
		evil := expectPhase(ns, "evil-1", buildlockv1.PhaseWaiting)

		// A build created in a later second, by a client whose clock runs a
		// second less than the allowance ahead: its timestamp is later than
		// what the claim from year 9999 is capped to.
		next := evil.CreationTimestamp.Add(time.Second + 100*time.Millisecond)
		time.Sleep(time.Until(next))
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7", timestamp: time.Now().Add(buildlockv1.MaxTimestampSkew - time.Second)})
		expectPhase(ns, "web-7", buildlockv1.PhaseWaiting)
		got := expectPhase(ns, "evil-1", buildlockv1.PhaseSuperseded)
		Expect(got.Status.SupersededBy).To(Equal("web-7"))
	})

	DescribeTable("allows a few seconds of clock skew, or what --max-timestamp-skew says",
		func(skew time.Duration, aheadWins bool) {
			ns := newNamespace()
			startManager(testenv.ManagerOptions{MaxTimestampSkew: skew}, ns)
			createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
			expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
			// Stamped 20 seconds ahead of its creation: within the 30
			// seconds the operator used to allow.
			createClaim(ns, "ahead-1", claimOpts{repo: "evil/repo", build: 1, pod: "ahead-1", timestamp: time.Now().Add(20 * time.Second)})
			ahead := expectPhase(ns, "ahead-1", buildlockv1.PhaseWaiting)
			// An honest build of another line, created a little more than
			// the default allowance later.
			time.Sleep(time.Until(ahead.CreationTimestamp.Add(buildlockv1.MaxTimestampSkew + time.Second + 100*time.Millisecond)))
			createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7", timestamp: time.Now()})
			if aheadWins {
				Expect(expectPhase(ns, "web-7", buildlockv1.PhaseSuperseded).Status.SupersededBy).To(Equal("ahead-1"))
				return
			}
			Expect(expectPhase(ns, "ahead-1", buildlockv1.PhaseSuperseded).Status.SupersededBy).To(Equal("web-7"))
			expectPhase(ns, "web-7", buildlockv1.PhaseWaiting)
		},
		Entry("by default a claim stamped 20 s ahead loses to one created 6 s later", time.Duration(0), false),
		Entry("with --max-timestamp-skew=1m it wins", time.Minute, true),
	)

	It("says that a renewal stamped in the past ended the hold", func() {
		ns := newNamespace()
		clock := &offsetClock{}
		startManager(testenv.ManagerOptions{Clock: clock}, ns)
		createClaim(ns, "nopod-1", claimOpts{repo: "acme/shop", build: 1, expiresAfter: 10 * time.Second})
		acquired := expectPhase(ns, "nopod-1", buildlockv1.PhaseHeld).Status.AcquiredAt.Time
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		expectPhase(ns, "web-7", buildlockv1.PhaseWaiting)

		// The operator's clock is 30 s on; a client whose clock is 25 s
		// behind renews, stamping 5 s after the grant.
		clock.advance(30 * time.Second)
		stamp := acquired.Add(5 * time.Second).UTC()
		patchSpec(ns, "nopod-1", fmt.Sprintf(`{"spec":{"renewTime":%q}}`, stamp.Format(time.RFC3339Nano)))
		bl := expectPhase(ns, "nopod-1", buildlockv1.PhaseExpired)
		Expect(bl.Status.Reason).To(Equal(buildlockv1.ReasonExpired))
		Expect(bl.Status.Message).To(ContainSubstring("was renewed with spec.renewTime " + stamp.Format(time.RFC3339) +
			", which is more than its expiresAfter of 10s before the operator saw the renewal"))
		Expect(bl.Status.Message).NotTo(ContainSubstring("not renewed in time"))
		expectPhase(ns, "web-7", buildlockv1.PhaseHeld)
	})

	It("hands the lock on when a force-release reason is 40,000 characters long", func() {
		ns := newNamespace()
		startManager(testenv.ManagerOptions{}, ns)
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		web := createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		expectPhase(ns, "web-7", buildlockv1.PhaseWaiting)

		forceRelease := func(reason string) error {
			patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{buildlockv1.ForceReleaseAnnotation: reason}}})
			Expect(err).NotTo(HaveOccurred())
			return k8sClient.Patch(ctx, &buildlockv1.BuildLock{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "shop-41"}},
				client.RawPatch(types.MergePatchType, patch))
		}
		// Control characters never get that far (issue 31: buildlock-text);
		// the operator escapes any that an install without it lets through.
		Expect(forceRelease("alice: the deploy hangs\n\x1b[31m")).To(MatchError(ContainSubstring(
			"annotation buildlock.io/force-release must not contain invisible, bidirectional or control characters: it has U+000A at character 24")))
		Expect(forceRelease("alice: " + strings.Repeat("the deploy hangs; [31m ", 40_000/24))).To(Succeed())

		Eventually(func(g Gomega) {
			old := getClaim(g, ns, "shop-41")
			g.Expect(old.Status.Phase).To(Equal(buildlockv1.PhaseReleased))
			g.Expect(old.Status.Reason).To(Equal(buildlockv1.ReasonForceReleased))
			g.Expect(len(old.Status.Message)).To(BeNumerically("<", 4096))
			g.Expect(old.Status.Message).To(ContainSubstring(`"alice: the deploy hangs; [31m the deploy hangs`), "quoted")
			g.Expect(old.Status.Message).To(ContainSubstring("…"), "cut")
			g.Expect(getClaim(g, ns, "web-7").Status.Phase).To(Equal(buildlockv1.PhaseHeld))
		}).WithTimeout(5 * time.Second).Should(Succeed())
		expectGrant(ns, "staging", web, 2)
	})

	It("never grants a build below one of its line that already held, even after its claim is gone, and grants a re-run", func() {
		ns := newNamespace()
		startManager(testenv.ManagerOptions{}, ns)
		createClaim(ns, "shop-10", claimOpts{repo: "acme/shop", build: 10, pod: "shop-10"})
		expectPhase(ns, "shop-10", buildlockv1.PhaseHeld)
		Expect(k8sClient.Delete(ctx, getClaim(Default, ns, "shop-10"))).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(getLease(g, ns, "staging").Spec.HolderIdentity).To(BeNil())
		}).Should(Succeed())

		createClaim(ns, "shop-9", claimOpts{repo: "acme/shop", build: 9, pod: "shop-9"})
		late := expectPhase(ns, "shop-9", buildlockv1.PhaseSuperseded)
		Expect(late.Status.Reason).To(Equal(buildlockv1.ReasonSupersededByNewerBuild))
		Expect(late.Status.Message).To(ContainSubstring("Build 10 of acme/shop@main already deployed: it held staging at"))

		// A re-run of build 10 (its first run's claim is gone) deploys again.
		createClaim(ns, "shop-10-rerun", claimOpts{repo: "acme/shop", build: 10, pod: "shop-10-rerun"})
		Expect(expectPhase(ns, "shop-10-rerun", buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(int64(2)))
		setPodPhase(ns, "shop-10-rerun", corev1.PodSucceeded)
		expectPhase(ns, "shop-10-rerun", buildlockv1.PhaseReleased)

		createClaim(ns, "shop-11", claimOpts{repo: "acme/shop", build: 11, pod: "shop-11"})
		Expect(expectPhase(ns, "shop-11", buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(int64(3)))
	})

	It("deletes the Lease of a lock nobody claims after --grant-retention, and never repeats a token", func() {
		ns := newNamespace()
		startManager(testenv.ManagerOptions{GrantRetention: 2 * time.Second}, ns)
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		Expect(expectPhase(ns, "shop-41", buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(int64(1)))
		Expect(k8sClient.Delete(ctx, getClaim(Default, ns, "shop-41"))).To(Succeed())

		Eventually(func(g Gomega) {
			var lease coordinationv1.Lease
			err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "buildlock-staging"}, &lease)
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the idle Lease is deleted: %v", err)
		}).WithTimeout(10 * time.Second).Should(Succeed())
		var floor coordinationv1.Lease
		Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "buildlock.token-floor"}, &floor)).To(Succeed())
		Expect(floor.Spec.LeaseTransitions).To(HaveValue(BeNumerically(">=", 1)), "the floor holds the deleted Lease's token")

		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		Expect(expectPhase(ns, "web-7", buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(int64(*floor.Spec.LeaseTransitions)+1),
			"the new Lease starts above the floor")
	})

	It("cleans up idle Leases it finds when it starts", func() {
		ns := newNamespace()
		idle := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "buildlock-gone", Labels: map[string]string{
				"app.kubernetes.io/managed-by": "buildlock", "buildlock.io/target": "gone",
			}},
			Spec: coordinationv1.LeaseSpec{LeaseTransitions: ptr.To(int32(7)), RenewTime: &metav1.MicroTime{Time: time.Now().Add(-time.Hour)}},
		}
		Expect(k8sClient.Create(ctx, idle)).To(Succeed())
		startManager(testenv.ManagerOptions{GrantRetention: time.Minute}, ns)
		Eventually(func(g Gomega) {
			err := k8sClient.Get(ctx, client.ObjectKeyFromObject(idle), &coordinationv1.Lease{})
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%v", err)
		}).WithTimeout(5 * time.Second).Should(Succeed())
		createClaim(ns, "gone-1", claimOpts{target: "gone", repo: "acme/shop", build: 1, pod: "gone-1"})
		Expect(expectPhase(ns, "gone-1", buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(int64(8)))
	})
})
