package controller_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/buildlock/buildlock/internal/testenv"
)

// These are shared by every spec in the package. The suite starts only the
// API server and etcd: specs that need a manager start and stop their own.
var (
	cfg       *rest.Config
	k8sClient client.Client // direct, uncached: reads see the API server's latest state
	scheme    *runtime.Scheme
	testEnv   *testenv.Environment
	ctx       context.Context
	cancel    context.CancelFunc
	// githubIssuer and gitlabIssuer sign the OIDC tokens of CI jobs, which
	// the API server trusts as examples/*/authentication.yaml configure it.
	githubIssuer, gitlabIssuer *testenv.OIDCIssuer
)

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Controller Suite")
}

var _ = BeforeSuite(func() {
	// GinkgoLogr writes to GinkgoWriter: logs show only for failed specs (or
	// with -ginkgo.v), and need no logging module beyond logr.
	logf.SetLogger(GinkgoLogr)
	// Eventually returns as soon as it succeeds: a generous bound costs
	// nothing when the machine is idle, and keeps a loaded CI machine (two
	// cores, several test packages at once) from failing a spec that would
	// have passed a moment later. Consistently keeps its own, explicit
	// durations.
	SetDefaultEventuallyTimeout(10 * time.Second)
	SetDefaultEventuallyPollingInterval(20 * time.Millisecond)

	ctx, cancel = context.WithCancel(context.TODO())

	scheme = testenv.Scheme()

	By("starting OIDC issuers shaped like GitHub Actions' and GitLab's")
	var err error
	githubIssuer, err = testenv.StartOIDCIssuer("https://token.actions.githubusercontent.com")
	Expect(err).NotTo(HaveOccurred())
	gitlabIssuer, err = testenv.StartOIDCIssuer("https://gitlab.com")
	Expect(err).NotTo(HaveOccurred())
	authn, err := testenv.AuthenticationFrom([]*testenv.OIDCIssuer{githubIssuer, gitlabIssuer},
		"examples/github-actions/authentication.yaml", "examples/gitlab/authentication.yaml")
	Expect(err).NotTo(HaveOccurred())

	By("starting a real kube-apiserver and etcd with the generated CRDs, trusting the issuers as the examples configure a cluster")
	testEnv, err = testenv.New(testenv.WithAuthentication(GinkgoT().TempDir(), authn))
	Expect(err).NotTo(HaveOccurred())
	cfg, err = testEnv.Start()
	Expect(err).NotTo(HaveOccurred(), "starting envtest; run `make envtest` to build bin/k8s/%s", testenv.K8sVersion)
	Expect(cfg).NotTo(BeNil())

	By("installing the enforcement admission policies, as the chart does with enforcement.enabled")
	Expect(testenv.InstallEnforcement(ctx, cfg)).To(Succeed())

	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	Expect(k8sClient).NotTo(BeNil())
})

var _ = AfterSuite(func() {
	By("stopping the test environment")
	if cancel != nil {
		cancel()
	}
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
	for _, i := range []*testenv.OIDCIssuer{githubIssuer, gitlabIssuer} {
		if i != nil {
			i.Close()
		}
	}
})
