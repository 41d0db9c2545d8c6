package controller_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/testenv"
)

// Issue 22: re-runs, rollbacks, second workflows, the Decided condition and
// the audit of endings, against the real API server.

// expectCondition waits until the claim's condition typ has status.
func expectCondition(ns, name, typ string, status metav1.ConditionStatus) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		c := meta.FindStatusCondition(getClaim(g, ns, name).Status.Conditions, typ)
		g.Expect(c).NotTo(BeNil(), "claim %s has no %s condition", name, typ)
		g.Expect(c.Status).To(Equal(status))
	}).Should(Succeed())
}

// counterValue is the value of the counter name whose one label has value
// label, as reg gathers it (0 when it has none).
func counterValue(g Gomega, reg *prometheus.Registry, name, label string) float64 {
	families, err := reg.Gather()
	g.Expect(err).NotTo(HaveOccurred())
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == label {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// auditOf is the grant record's audit of target staging in ns.
func auditOf(g Gomega, ns string) []buildlockv1.AuditEntry {
	var audit []buildlockv1.AuditEntry
	if s := getLease(g, ns, "staging").Annotations[buildlockv1.AuditAnnotation]; s != "" {
		g.Expect(json.Unmarshal([]byte(s), &audit)).To(Succeed())
	}
	return audit
}

// createRollback creates a claim (with its pod) that rolls back for reason,
// as client c.
func createRollback(c client.Client, ns, name string, o claimOpts, reason string) {
	GinkgoHelper()
	if o.pod != "" {
		createPod(ns, o.pod)
	}
	bl := newClaim(ns, name, o)
	bl.Spec.Rollback = &buildlockv1.Rollback{Reason: reason}
	Expect(c.Create(ctx, bl)).To(Succeed())
}

// setPolicy creates staging's BuildLockPolicy in ns with spec.
func setPolicy(ns string, spec buildlockv1.BuildLockPolicySpec) {
	GinkgoHelper()
	p := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "staging"}, Spec: spec}
	Expect(k8sClient.Create(ctx, p)).To(Succeed())
	Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(p), p)).To(Succeed())
		ready := meta.FindStatusCondition(p.Status.Conditions, buildlockv1.ConditionReady)
		g.Expect(ready).NotTo(BeNil())
		g.Expect(ready.Status).To(Equal(metav1.ConditionTrue))
		g.Expect(ready.ObservedGeneration).To(Equal(p.Generation))
	}).Should(Succeed())
}

var _ = Describe("Re-runs, rollbacks and second workflows", func() {
	It("grants a re-run of a failed deploy once the first run's claim ended, never two runs at once, and refuses re-runs where the policy says so", func() {
		ns := newNamespace()
		startScopedManager(testenv.ManagerOptions{}, ns)
		createClaim(ns, "shop-500", claimOpts{repo: "acme/shop", build: 500, pod: "shop-500"})
		expectPhase(ns, "shop-500", buildlockv1.PhaseHeld)
		expectCondition(ns, "shop-500", buildlockv1.ConditionDecided, metav1.ConditionTrue)

		By("a second run while the first holds is refused")
		createClaim(ns, "shop-500-twice", claimOpts{repo: "acme/shop", build: 500, pod: "shop-500-twice"})
		twice := expectPhase(ns, "shop-500-twice", buildlockv1.PhaseSuperseded)
		Expect(twice.Status.Reason).To(Equal(buildlockv1.ReasonDuplicateBuild))
		Expect(twice.Status.SupersededBy).To(Equal("shop-500"))
		Expect(twice.Status.Message).To(ContainSubstring("holds staging as BuildLock shop-500, another run of the same build"))
		expectCondition(ns, "shop-500-twice", buildlockv1.ConditionDecided, metav1.ConditionTrue)

		By("a waiting claim is not decided yet")
		createClaim(ns, "web-7", claimOpts{repo: "acme/web", build: 7, pod: "web-7"})
		expectPhase(ns, "web-7", buildlockv1.PhaseWaiting)
		expectCondition(ns, "web-7", buildlockv1.ConditionDecided, metav1.ConditionFalse)

		By("the deploy fails; the job is re-run with the same build number")
		setPodPhase(ns, "shop-500", corev1.PodFailed)
		expectPhase(ns, "shop-500", buildlockv1.PhaseReleased)
		expectPhase(ns, "web-7", buildlockv1.PhaseHeld)
		createClaim(ns, "shop-500-retry", claimOpts{repo: "acme/shop", build: 500, pod: "shop-500-retry"})
		expectPhase(ns, "shop-500-retry", buildlockv1.PhaseWaiting)
		setPodPhase(ns, "web-7", corev1.PodSucceeded)
		Expect(expectPhase(ns, "shop-500-retry", buildlockv1.PhaseHeld).Status.FencingToken).To(Equal(int64(3)))

		By("where the policy refuses re-runs, a build deploys once")
		setPodPhase(ns, "shop-500-retry", corev1.PodSucceeded)
		expectPhase(ns, "shop-500-retry", buildlockv1.PhaseReleased)
		setPolicy(ns, buildlockv1.BuildLockPolicySpec{Reruns: buildlockv1.RerunsRefused})
		createClaim(ns, "shop-500-third", claimOpts{repo: "acme/shop", build: 500, pod: "shop-500-third"})
		third := expectPhase(ns, "shop-500-third", buildlockv1.PhaseSuperseded)
		Expect(third.Status.Reason).To(Equal(buildlockv1.ReasonDuplicateBuild))
		Expect(third.Status.Message).To(ContainSubstring("refuses re-runs (spec.reruns: Refused)"))
	})

	It("rolls back on purpose: the rollback holds, is recorded where it outlives its claim, and the line's next build deploys", func() {
		ns := newNamespace()
		reg := prometheus.NewRegistry()
		// No requester is verified within the test (the suite's requester
		// policy settles after a day), so the rollback counts as unverified
		// whenever the spec runs.
		startScopedManager(testenv.ManagerOptions{Registry: reg, RequesterSettle: 24 * time.Hour}, ns)
		createClaim(ns, "shop-42", claimOpts{repo: "acme/shop", build: 42, pod: "shop-42"})
		expectPhase(ns, "shop-42", buildlockv1.PhaseHeld)
		setPodPhase(ns, "shop-42", corev1.PodSucceeded)
		expectPhase(ns, "shop-42", buildlockv1.PhaseReleased)

		By("build 41 again, without --rollback, is refused, and told how to roll back")
		createClaim(ns, "shop-41", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41"})
		refused := expectPhase(ns, "shop-41", buildlockv1.PhaseSuperseded)
		Expect(refused.Status.Message).To(ContainSubstring("Build 42 of acme/shop@main already deployed"))
		Expect(refused.Status.Message).To(ContainSubstring("kubectl buildlock acquire --rollback"))

		By("build 41 as a rollback holds")
		createRollback(k8sClient, ns, "shop-41-rollback", claimOpts{repo: "acme/shop", build: 41, pod: "shop-41-rollback"}, "INC-7: 42 breaks checkout")
		rolledBack := expectPhase(ns, "shop-41-rollback", buildlockv1.PhaseHeld)
		Expect(rolledBack.Status.Message).To(ContainSubstring(`as a rollback of acme/shop@main to build 41 ("INC-7: 42 breaks checkout")`))
		Eventually(func(g Gomega) []string { return eventReasons(g, ns, "shop-41-rollback") }).Should(ContainElement("RolledBack"))
		Eventually(func(g Gomega) {
			g.Expect(counterValue(g, reg, "buildlock_rollbacks_total", "unverified")).To(Equal(1.0))
		}).Should(Succeed())

		By("its claim goes; the grant record keeps the rollback")
		Expect(k8sClient.Delete(ctx, rolledBack)).To(Succeed())
		Eventually(func(g Gomega) {
			audit := auditOf(g, ns)
			g.Expect(audit).To(HaveLen(1))
			g.Expect(audit[0].Kind).To(Equal(buildlockv1.AuditRollback))
			g.Expect(audit[0].Name).To(Equal("shop-41-rollback"))
			g.Expect(audit[0].Build).To(Equal(int64(41)))
			g.Expect(audit[0].From).To(Equal(int64(42)))
			g.Expect(audit[0].Reason).To(Equal("INC-7: 42 breaks checkout"))
			g.Expect(getLease(g, ns, "staging").Spec.HolderIdentity).To(BeNil())
		}).Should(Succeed())

		By("the line's next build deploys normally, a lower one does not")
		createClaim(ns, "shop-42-fixed", claimOpts{repo: "acme/shop", build: 42, pod: "shop-42-fixed"})
		expectPhase(ns, "shop-42-fixed", buildlockv1.PhaseHeld)
		createClaim(ns, "shop-40", claimOpts{repo: "acme/shop", build: 40, pod: "shop-40"})
		Expect(expectPhase(ns, "shop-40", buildlockv1.PhaseSuperseded).Status.Reason).To(Equal(buildlockv1.ReasonSupersededByNewerBuild))
	})

	It("allows rollbacks by people only where the policy says so, judged by the requester the API server stamped", func() {
		ns := newNamespace()
		reg := prometheus.NewRegistry()
		startScopedManager(testenv.ManagerOptions{Registry: reg, RequesterSettle: time.Nanosecond}, ns)
		pipeline := identity{user: "system:serviceaccount:" + ns + ":pipeline"}
		person := identity{user: "alice@example.com"}
		grantAll(ns, pipeline.user)
		grantAll(ns, person.user)
		// A claim created in the requester policy's second would not count
		// as created after it.
		var policy admissionv1.MutatingAdmissionPolicy
		Expect(k8sClient.Get(ctx, types.NamespacedName{Name: "buildlock-requester"}, &policy)).To(Succeed())
		time.Sleep(time.Until(policy.CreationTimestamp.Add(2 * time.Second)))
		setPolicy(ns, buildlockv1.BuildLockPolicySpec{Rollbacks: buildlockv1.RollbacksPeopleOnly})

		createRollback(pipeline.client(), ns, "shop-41-pipeline", claimOpts{repo: "acme/shop", build: 41}, "the pipeline's")
		refused := expectPhase(ns, "shop-41-pipeline", buildlockv1.PhaseSuperseded)
		Expect(refused.Status.Reason).To(Equal(buildlockv1.ReasonRollbackNotAllowed))
		Expect(refused.Status.Message).To(ContainSubstring("allows rollbacks by people only (spec.rollbacks: PeopleOnly), and this claim was created by " + pipeline.user))

		createRollback(person.client(), ns, "shop-41-alice", claimOpts{repo: "acme/shop", build: 41}, "alice's")
		expectPhase(ns, "shop-41-alice", buildlockv1.PhaseHeld)
		Eventually(func(g Gomega) {
			g.Expect(counterValue(g, reg, "buildlock_rollbacks_total", "person")).To(Equal(1.0))
			audit := auditOf(g, ns)
			g.Expect(audit).To(HaveLen(1))
			g.Expect(audit[0].By).To(Equal(person.user))
		}).Should(Succeed())
	})

	It("keeps a second workflow of one repository and branch on a line of its own", func() {
		ns := newNamespace()
		startScopedManager(testenv.ManagerOptions{}, ns)
		const deploy, hotfix = "acme/shop/.github/workflows/deploy.yml", "acme/shop/.github/workflows/hotfix.yml"
		ofWorkflow := func(name string, build int64, workflow string) {
			GinkgoHelper()
			createPod(ns, name)
			bl := newClaim(ns, name, claimOpts{repo: "acme/shop", build: build, pod: name})
			bl.Spec.Workflow = workflow
			Expect(k8sClient.Create(ctx, bl)).To(Succeed())
		}
		ofWorkflow("deploy-500", 500, deploy)
		expectPhase(ns, "deploy-500", buildlockv1.PhaseHeld)
		setPodPhase(ns, "deploy-500", corev1.PodSucceeded)
		expectPhase(ns, "deploy-500", buildlockv1.PhaseReleased)

		ofWorkflow("hotfix-12", 12, hotfix)
		expectPhase(ns, "hotfix-12", buildlockv1.PhaseHeld)
		setPodPhase(ns, "hotfix-12", corev1.PodSucceeded)
		expectPhase(ns, "hotfix-12", buildlockv1.PhaseReleased)

		ofWorkflow("deploy-499", 499, deploy)
		old := expectPhase(ns, "deploy-499", buildlockv1.PhaseSuperseded)
		Expect(old.Status.Message).To(HavePrefix("Build 500 of acme/shop@main (workflow " + deploy + ") already deployed"))
		Expect(getLease(Default, ns, "staging").Annotations["buildlock.io/lines"]).To(ContainSubstring(`"workflow":"` + hotfix + `"`))
	})

	It("records a force-release in the grant record, where it outlives the holder's claim", func() {
		ns := newNamespace()
		startScopedManager(testenv.ManagerOptions{}, ns)
		holder := createClaim(ns, "shop-42", claimOpts{repo: "acme/shop", build: 42, pod: "shop-42"})
		expectPhase(ns, "shop-42", buildlockv1.PhaseHeld)
		patch := `{"metadata":{"annotations":{"buildlock.io/force-release":"alice: the deploy hangs, INC-9"}}}`
		Expect(k8sClient.Patch(ctx, holder, client.RawPatch(types.MergePatchType, []byte(patch)))).To(Succeed())
		expectPhase(ns, "shop-42", buildlockv1.PhaseReleased)
		// The holder's plugin deletes its claim when its command is stopped.
		Expect(k8sClient.Delete(ctx, holder)).To(Succeed())
		Eventually(func(g Gomega) {
			audit := auditOf(g, ns)
			g.Expect(audit).To(HaveLen(1))
			g.Expect(audit[0].Kind).To(Equal(buildlockv1.AuditForceRelease))
			g.Expect(audit[0].Name).To(Equal("shop-42"))
			g.Expect(audit[0].Token).To(Equal(int64(1)))
			g.Expect(audit[0].Reason).To(Equal("alice: the deploy hangs, INC-9"))
			var bl buildlockv1.BuildLock
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(holder), &bl)).NotTo(Succeed(), "the claim is gone")
		}).Should(Succeed())
	})
})

// previousReleaseCommit is the commit this branch started from: main as it
// was before issue 22, whose CRDs and objects the upgrade spec starts from.
// It must stay in the history the tests run in.
const previousReleaseCommit = "8bcd263b89fc382ca735d58c2c6cd078be3300d9"

// Claims, a policy and a grant Lease as the release before issue 22 wrote
// them, under its CRDs: after the CRDs are upgraded they are decided as
// before, and the new fields work next to them.
var _ = Describe("Claims written by the previous release", Ordered, func() {
	const ci = "ci"
	var (
		cfg2  *rest.Config
		admin client.Client
	)
	BeforeAll(func() {
		root, err := testenv.RepoRoot()
		Expect(err).NotTo(HaveOccurred())
		crds := GinkgoT().TempDir()
		for _, file := range []string{"buildlock.io_buildlocks.yaml", "buildlock.io_buildlockpolicies.yaml"} {
			show := exec.Command("git", "show", previousReleaseCommit+":config/crd/bases/"+file)
			show.Dir = root
			out, err := show.Output()
			Expect(err).NotTo(HaveOccurred(), "git show %s (the spec needs the history: git fetch --unshallow)", previousReleaseCommit)
			Expect(os.WriteFile(filepath.Join(crds, file), out, 0o600)).To(Succeed())
		}
		// As the previous release installed by default: without the identity
		// admission policies.
		env, err := testenv.New(testenv.WithoutIdentityPolicies())
		Expect(err).NotTo(HaveOccurred())
		env.CRDDirectoryPaths = []string{crds}
		cfg2, err = env.Start()
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(env.Stop)
		admin, err = client.New(cfg2, client.Options{Scheme: scheme})
		Expect(err).NotTo(HaveOccurred())
		Expect(admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ci}})).To(Succeed())

		By("writing what the previous release wrote: a claim that held, and the grant Lease that remembers it")
		heldAt := time.Now().Add(-time.Hour).UTC().Truncate(time.Second)
		held := newClaim(ci, "shop-42", claimOpts{repo: "acme/shop", build: 42})
		Expect(admin.Create(ctx, held)).To(Succeed())
		held.Status = buildlockv1.BuildLockStatus{
			Phase: buildlockv1.PhaseReleased, Reason: buildlockv1.ReasonDeleted, FencingToken: 3,
			AcquiredAt: &metav1.MicroTime{Time: heldAt}, FinishedAt: &metav1.MicroTime{Time: heldAt.Add(time.Minute)},
			Message: "The BuildLock of build 42 of acme/shop@main was deleted (a finalizer still keeps it); its hold on staging ends: stop deploying.",
			Conditions: []metav1.Condition{{Type: buildlockv1.ConditionAcquired, Status: metav1.ConditionFalse, Reason: buildlockv1.ReasonDeleted,
				Message: "The BuildLock ...", LastTransitionTime: metav1.NewTime(heldAt)}},
		}
		Expect(admin.Status().Update(ctx, held)).To(Succeed())
		lease := &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: ci, Name: "buildlock-staging",
				Labels: map[string]string{"app.kubernetes.io/managed-by": "buildlock", "buildlock.io/target": "staging"},
				Annotations: map[string]string{
					"buildlock.io/lines": `[{"repo":"acme/shop","branch":"main","build":42,"heldAt":"` + heldAt.Format(time.RFC3339Nano) + `"}]`,
					"buildlock.io/ended": `{"name":"shop-42","uid":"` + string(held.UID) + `","phase":"Released","reason":"Deleted","at":"` +
						heldAt.Add(time.Minute).Format(time.RFC3339Nano) + `"}`,
				}},
			Spec: coordinationv1.LeaseSpec{LeaseTransitions: ptr.To(int32(3)), RenewTime: &metav1.MicroTime{Time: heldAt.Add(time.Minute)}},
		}
		Expect(admin.Create(ctx, lease)).To(Succeed())
		Expect(admin.Create(ctx, &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ci, Name: "staging"},
			Spec: buildlockv1.BuildLockPolicySpec{Ordering: buildlockv1.OrderingNewestWins}})).To(Succeed())
		for _, c := range []*buildlockv1.BuildLock{
			newClaim(ci, "shop-41", claimOpts{repo: "acme/shop", build: 41, expiresAfter: time.Hour}),
			newClaim(ci, "shop-43", claimOpts{repo: "acme/shop", build: 43, expiresAfter: time.Hour}),
		} {
			Expect(admin.Create(ctx, c)).To(Succeed())
		}

		By("upgrading the CRDs to this release's, as `helm upgrade` or `kubectl apply` does")
		_, err = envtest.InstallCRDs(cfg2, envtest.CRDInstallOptions{Paths: []string{filepath.Join(root, "config", "crd", "bases")}})
		Expect(err).NotTo(HaveOccurred())
		Eventually(func() error {
			bl := newClaim(ci, "probe", claimOpts{repo: "acme/shop", build: 1})
			bl.Spec.Workflow = "probe.yml"
			return admin.Create(ctx, bl, client.DryRunAll)
		}).Should(Succeed(), "the API server serves spec.workflow")
		mgr, err := testenv.StartManager(ctx, cfg2, testenv.ManagerOptions{})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(mgr.Stop)
	})

	phase := func(name string) func(g Gomega) *buildlockv1.BuildLock {
		return func(g Gomega) *buildlockv1.BuildLock {
			var bl buildlockv1.BuildLock
			g.Expect(admin.Get(ctx, types.NamespacedName{Namespace: ci, Name: name}, &bl)).To(Succeed())
			return &bl
		}
	}

	It("decides the old claims as before: the old memory supersedes a lower build, a higher one holds", func() {
		Eventually(phase("shop-41")).Should(HaveField("Status.Reason", buildlockv1.ReasonSupersededByNewerBuild))
		Eventually(phase("shop-43")).Should(HaveField("Status.Phase", buildlockv1.PhaseHeld))
		held := phase("shop-43")(Default)
		Expect(held.Status.FencingToken).To(Equal(int64(4)))
		Expect(meta.FindStatusCondition(held.Status.Conditions, buildlockv1.ConditionDecided)).To(HaveField("Status", metav1.ConditionTrue))
		old := phase("shop-42")(Default)
		Expect(old.Status.Message).To(HavePrefix("The BuildLock of build 42"), "a terminal claim keeps what the previous release wrote")
		var lease coordinationv1.Lease
		Expect(admin.Get(ctx, types.NamespacedName{Namespace: ci, Name: "buildlock-staging"}, &lease)).To(Succeed())
		Expect(lease.Annotations["buildlock.io/lines"]).To(ContainSubstring(`"build":43`))
		Expect(lease.Annotations["buildlock.io/lines"]).NotTo(ContainSubstring(`"workflow"`), "claims without a workflow stay on the old line")
	})

	It("takes the new fields next to the old claims: a workflow is a line of its own, and one nothing verified is judged by the old line too", func() {
		bl := newClaim(ci, "hotfix-2", claimOpts{repo: "acme/shop", build: 2, expiresAfter: time.Hour})
		bl.Spec.Workflow = "acme/shop/.github/workflows/hotfix.yml"
		Expect(admin.Create(ctx, bl)).To(Succeed())
		Eventually(phase("hotfix-2")).Should(HaveField("Status.Phase", buildlockv1.PhaseSuperseded))
		Expect(phase("hotfix-2")(Default).Status.Message).To(ContainSubstring("workflow acme/shop/.github/workflows/hotfix.yml is not verified"))
		bl = newClaim(ci, "hotfix-44", claimOpts{repo: "acme/shop", build: 44, expiresAfter: time.Hour})
		bl.Spec.Workflow = "acme/shop/.github/workflows/hotfix.yml"
		Expect(admin.Create(ctx, bl)).To(Succeed())
		Eventually(phase("hotfix-44")).Should(HaveField("Status.Phase", buildlockv1.PhaseWaiting))
		Expect(strings.Contains(phase("hotfix-44")(Default).Status.Message, "Waiting for build 43 of acme/shop@main")).To(BeTrue())
	})
})
