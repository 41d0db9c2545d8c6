package controller_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	buildlockv1alpha1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// k8sVersion is the control plane `make envtest` builds into bin/k8s/<version>;
// keep it in step with K8S_VERSION in the Makefile.
const k8sVersion = "1.37.2"

// These are shared by every spec in the package. The suite starts only the
// API server and etcd: specs that need a manager start and stop their own.
var (
	cfg       *rest.Config
	k8sClient client.Client // direct, uncached: reads see the API server's latest state
	scheme    *runtime.Scheme
	testEnv   *envtest.Environment
	ctx       context.Context
	cancel    context.CancelFunc
)

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Controller Suite")
}

var _ = BeforeSuite(func() {
	// GinkgoLogr writes to GinkgoWriter: logs show only for failed specs (or
	// with -ginkgo.v), and need no logging module beyond logr.
	logf.SetLogger(GinkgoLogr)

	ctx, cancel = context.WithCancel(context.TODO())

	scheme = runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(buildlockv1alpha1.AddToScheme(scheme)).To(Succeed())

	By("starting a real kube-apiserver and etcd with the generated CRDs")
	testEnv = &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	// KUBEBUILDER_ASSETS wins when set (the Makefile exports it); otherwise use
	// the binaries `make envtest` built, so that a plain `go test` works too.
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		testEnv.BinaryAssetsDirectory = filepath.Join("..", "..", "bin", "k8s", k8sVersion)
	}

	var err error
	cfg, err = testEnv.Start()
	Expect(err).NotTo(HaveOccurred(), "starting envtest; run `make envtest` to build bin/k8s/%s", k8sVersion)
	Expect(cfg).NotTo(BeNil())

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
})
