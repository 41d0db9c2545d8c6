package controller_test

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

var _ = Describe("The manager's options", func() {
	It("warns at 80 % of --max-hold and ends the hold at 100 %", func() {
		clock := &offsetClock{}
		mgr, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{Clock: clock, MaxHold: time.Hour})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(mgr.Stop()).To(Succeed()) })
		ns := newNamespace()
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		expectPhase(ns, "web-7", buildlockv1.PhaseWaiting)

		clock.advance(50 * time.Minute)
		poke(ns, "shop-41")
		Eventually(func(g Gomega) []string { return eventReasons(g, ns, "shop-41") }).Should(ContainElement("MaxHoldApproaching"))
		Expect(getClaim(Default, ns, "shop-41").Status.Phase).To(Equal(buildlockv1.PhaseHeld))

		clock.advance(11 * time.Minute)
		poke(ns, "shop-41")
		Expect(expectPhase(ns, "shop-41", buildlockv1.PhaseExpired).Status.Reason).To(Equal(buildlockv1.ReasonMaxHoldExceeded))
		Expect(expectPhase(ns, "web-7", buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(int64(2)))
	})

	It("deletes finished claims after --finished-ttl and nothing else", func() {
		clock := &offsetClock{}
		mgr, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{Clock: clock, FinishedTTL: time.Hour})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(mgr.Stop()).To(Succeed()) })
		ns := newNamespace()
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		createClaim(ns, "shop-40", claimOpts{repo: "acme/shop", build: 40, pod: "shop-40"})
		expectPhase(ns, "shop-40", buildlockv1.PhaseSuperseded)

		clock.advance(30 * time.Minute)
		poke(ns, "shop-41")
		Consistently(func() error {
			return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "shop-40"}, &buildlockv1.BuildLock{})
		}, "1s").Should(Succeed())

		clock.advance(31 * time.Minute)
		poke(ns, "shop-41")
		Eventually(func() bool {
			err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "shop-40"}, &buildlockv1.BuildLock{})
			return apierrors.IsNotFound(err)
		}).Should(BeTrue())
		Expect(getClaim(Default, ns, "shop-41").Status.Phase).To(Equal(buildlockv1.PhaseHeld))
		var pods corev1.PodList
		Expect(k8sClient.List(ctx, &pods)).To(Succeed())
		Expect(pods.Items).NotTo(BeEmpty(), "the operator never deletes pods")
	})

	It("exports grants, hand-offs and held locks as metrics without per-claim labels", func() {
		// Scoped to one namespace (--namespaces), so that other specs' locks
		// do not count.
		ns := newNamespace()
		reg := prometheus.NewRegistry()
		mgr, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{Registry: reg, Namespaces: []string{ns}})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(mgr.Stop()).To(Succeed()) })
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		expectPhase(ns, "shop-41", buildlockv1.PhaseHeld)
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		createClaim(ns, "web-8", claimOpts{repo: "acme/web", build: 8, pod: "web-8"})
		expectPhase(ns, "web-7", buildlockv1.PhaseSuperseded)
		setPodPhase(ns, "shop-41", corev1.PodSucceeded)
		expectPhase(ns, "web-8", buildlockv1.PhaseHeld)

		Eventually(func(g Gomega) {
			g.Expect(testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP buildlock_grants_total Locks granted.
# TYPE buildlock_grants_total counter
buildlock_grants_total 2
`), "buildlock_grants_total")).To(Succeed())
		}).Should(Succeed())
		families, err := reg.Gather()
		Expect(err).NotTo(HaveOccurred())
		byName := map[string]*dto.MetricFamily{}
		for _, f := range families {
			byName[f.GetName()] = f
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					// policy: buildlock_identity_policy_installed's, one of seven names.
					Expect(l.GetName()).To(BeElementOf("reason", "namespace", "target", "policy"), "metric %s has a per-claim label", f.GetName())
				}
			}
		}
		// The per-lock gauges: web-8 holds, nobody waits.
		Expect(byName["buildlock_lock_hold_age_seconds"].GetMetric()).To(HaveLen(1))
		Expect(byName["buildlock_lock_hold_age_seconds"].GetMetric()[0].GetLabel()).To(ConsistOf(
			HaveField("GetValue()", ns), HaveField("GetValue()", "staging")))
		Expect(byName["buildlock_lock_waiting"].GetMetric()[0].GetGauge().GetValue()).To(Equal(0.0))
		Expect(byName).NotTo(HaveKey("buildlock_lock_wait_age_seconds"))
		Expect(byName).To(HaveKey("buildlock_supersessions_total"))
		Expect(byName["buildlock_supersessions_total"].GetMetric()[0].GetCounter().GetValue()).To(Equal(1.0))
		Expect(byName["buildlock_releases_total"].GetMetric()[0].GetLabel()[0].GetValue()).To(Equal("PodFinished"))
		Expect(byName["buildlock_hold_seconds"].GetMetric()[0].GetHistogram().GetSampleCount()).To(Equal(uint64(1)))
		Expect(byName["buildlock_wait_seconds"].GetMetric()[0].GetHistogram().GetSampleCount()).To(Equal(uint64(2)))
		Expect(byName["buildlock_locks_held"].GetMetric()[0].GetGauge().GetValue()).To(Equal(1.0))
	})

	It("leaves BuildLocks in namespaces it does not watch alone (--namespaces)", func() {
		watched, unwatched := newNamespace(), newNamespace()
		mgr, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{Namespaces: []string{watched}})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(mgr.Stop()).To(Succeed()) })
		createClaim(unwatched, "shop-1", claimOpts{repo: "acme/shop", build: 1, pod: "shop-1"})
		createClaim(watched, "shop-1", claimOpts{repo: "acme/shop", build: 1, pod: "shop-1"})
		expectPhase(watched, "shop-1", buildlockv1.PhaseHeld)
		Consistently(func(g Gomega) buildlockv1.Phase { return getClaim(g, unwatched, "shop-1").Status.Phase }, "2s").Should(BeEmpty())
	})
})
