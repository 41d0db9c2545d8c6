package controller_test

import (
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// tokenFloorOf reads the namespace's token floor (0 when there is none).
// A manager's first grant on a lock whose Lease it did not write itself
// (after a start, or an edit by somebody else) goes above the floor as it
// was then (bug 15 of docs/reliability.md).
func tokenFloorOf(g Gomega, ns string) int64 {
	var floor coordinationv1.Lease
	err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "buildlock.token-floor"}, &floor)
	if apierrors.IsNotFound(err) {
		return 0
	}
	g.Expect(err).NotTo(HaveOccurred())
	return buildlockv1.GrantToken(&floor)
}

// Issue 31, break 9 (bug 15 of docs/reliability.md): a person lowers a
// held lock's Lease token, and its holder's claim goes, before an operator
// writes the Lease again. A manager that did not see the token it replaced
// (it was not running, or its watch missed it) must not issue it again:
// the namespace's token floor, raised ahead of every grant, still holds it.
var _ = Describe("Tokens after a person lowered a grant Lease's token", func() {
	floorOf := func(ns string) int64 { return tokenFloorOf(Default, ns) }
	// holdNine makes nine claims hold staging in turn, each deleted once it
	// holds but the last, and returns the last.
	holdNine := func(ns string) *buildlockv1.BuildLock {
		GinkgoHelper()
		for b := int64(1); b <= 8; b++ {
			name := fmt.Sprintf("shop-%d", b)
			createClaim(ns, name, claimOpts{repo: "acme/shop", build: b, pod: name})
			Expect(expectPhase(ns, name, buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(b))
			Expect(k8sClient.Delete(ctx, getClaim(Default, ns, name))).To(Succeed())
		}
		createClaim(ns, "shop-9", claimOpts{repo: "acme/shop", build: 9, pod: "shop-9"})
		held := expectPhase(ns, "shop-9", buildlockv1.PhaseHeld)
		Expect(held.Status.FencingToken).To(Equal(int64(9)))
		return held
	}
	lowerTo1 := func(ns string) {
		GinkgoHelper()
		Eventually(func() error {
			lease := getLease(Default, ns, "staging")
			lease.Spec.LeaseTransitions = ptr.To(int32(1))
			return k8sClient.Update(ctx, lease)
		}).Should(Succeed())
	}

	It("never issues a token again when the holder's claim went while no manager ran", func() {
		ns := newNamespace()
		first, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{Namespaces: []string{ns}})
		Expect(err).NotTo(HaveOccurred())
		holdNine(ns)
		Expect(first.Stop()).To(Succeed())

		lowerTo1(ns)
		Expect(k8sClient.Delete(ctx, getClaim(Default, ns, "shop-9"))).To(Succeed())
		floor := floorOf(ns)
		Expect(floor).To(BeNumerically(">=", 9))

		startScopedManager(testenv.ManagerOptions{}, ns)
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		token := expectPhase(ns, "web-7", buildlockv1.PhaseHeld).Status.FencingToken
		Expect(token).To(BeNumerically(">", floor), "a token at or below the namespace's floor (%d) may have been issued already", floor)
	})

	It("never issues a token again when a new manager finds the lowered Lease naming a holder that is gone", func() {
		ns := newNamespace()
		first, err := testenv.StartManager(ctx, cfg, testenv.ManagerOptions{Namespaces: []string{ns}})
		Expect(err).NotTo(HaveOccurred())
		holdNine(ns)
		// Another claim waits; the new manager hands the lock to it.
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		expectPhase(ns, "web-7", buildlockv1.PhaseWaiting)
		Expect(first.Stop()).To(Succeed())

		lowerTo1(ns)
		Expect(k8sClient.Delete(ctx, getClaim(Default, ns, "shop-9"))).To(Succeed())
		startScopedManager(testenv.ManagerOptions{}, ns)
		Expect(expectPhase(ns, "web-7", buildlockv1.PhaseHeld).Status.FencingToken).To(BeNumerically(">", 9))
	})

	It("keeps tokens going up on a running manager, and hands on without reading the floor again", func() {
		ns := newNamespace()
		startScopedManager(testenv.ManagerOptions{}, ns)
		holdNine(ns)
		lowerTo1(ns)
		Expect(k8sClient.Delete(ctx, getClaim(Default, ns, "shop-9"))).To(Succeed())
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		first := expectPhase(ns, "web-7", buildlockv1.PhaseHeld).Status.FencingToken
		Expect(first).To(BeNumerically(">", 9))
		// The next hand-offs go one by one: the floor counted once.
		Expect(k8sClient.Delete(ctx, getClaim(Default, ns, "web-7"))).To(Succeed())
		createClaim(ns, "web-8", claimOpts{repo: "acme/web", build: 8, pod: "web-8"})
		Expect(expectPhase(ns, "web-8", buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(first + 1))
	})
})
