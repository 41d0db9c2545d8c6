// Package crd_test proves what the CRDs' schemas and CEL rules alone (there
// is no webhook) admit and refuse, against a real kube-apiserver and etcd
// with the generated CRDs and no operator running: every malformed claim or
// policy is refused with a message that names the field and says what to
// fix, and everything admitted decodes into the Go types.
package crd_test

import (
	"context"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/buildlock/buildlock/internal/testenv"
)

var (
	k8sClient client.Client // direct, uncached
	testEnv   *testenv.Environment
	ctx       context.Context
	cancel    context.CancelFunc
)

func TestCRDs(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "CRD Admission Suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(GinkgoLogr)
	ctx, cancel = context.WithCancel(context.TODO())
	var err error
	// The CRDs' own validation, alone: the identity admission policies
	// would stamp and judge some of the objects these specs send.
	testEnv, err = testenv.New(testenv.WithoutIdentityPolicies())
	Expect(err).NotTo(HaveOccurred())
	cfg, err := testEnv.Start()
	Expect(err).NotTo(HaveOccurred(), "starting envtest; run `make envtest` to build bin/k8s/%s", testenv.K8sVersion)
	k8sClient, err = client.New(cfg, client.Options{Scheme: testenv.Scheme()})
	Expect(err).NotTo(HaveOccurred())
})

var _ = AfterSuite(func() {
	if cancel != nil {
		cancel()
	}
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
})
