// Package testenv starts the real control plane the tests run against (etcd
// and kube-apiserver, built into bin/k8s by `make envtest`) with the
// BuildLock CRD and the identity admission policies of every install
// (config/identity) installed, and runs the operator's manager in-process. The
// controller, plugin, chaos and benchmark tests and the local cluster of
// `make run` share it, so that they all exercise the same wiring as
// cmd/manager.
package testenv

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/buildlock/buildlock/internal/controller"
	"github.com/buildlock/buildlock/internal/doctest"
)

// K8sVersion is the version of the control-plane binaries under bin/k8s.
const K8sVersion = "1.37.2"

// Scheme returns a scheme with the built-in kinds and buildlock's.
func Scheme() *runtime.Scheme { return controller.Scheme() }

// RepoRoot finds the repository root (the directory holding go.mod) from the
// working directory upwards, so that tests in any package find the CRDs and
// binaries.
func RepoRoot() (string, error) { return doctest.RepoRoot() }

// Environment is an envtest environment that installs, once started, the
// identity admission policies that every installation of buildlock has
// (config/identity), unless WithoutIdentityPolicies: tests run against the
// secure default.
type Environment struct {
	*envtest.Environment
	// identity says whether Start installs config/identity.
	identity bool
}

// Option configures the environment New returns.
type Option func(env *Environment) error

// WithoutIdentityPolicies leaves out the identity admission policies: for a
// test of what the operator does without them, or of the CRD's own
// validation, or for a caller that installs them itself (the chart test,
// with helm).
func WithoutIdentityPolicies() Option {
	return func(env *Environment) error {
		env.identity = false
		return nil
	}
}

// New returns an envtest environment with the BuildLock CRD and the
// identity admission policies, using the binaries in KUBEBUILDER_ASSETS or
// else bin/k8s/<version>, configured by opts.
func New(opts ...Option) (*Environment, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	env := &Environment{Environment: &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                Scheme(),
	}, identity: true}
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		env.BinaryAssetsDirectory = filepath.Join(root, "bin", "k8s", K8sVersion)
	}
	for _, o := range opts {
		if err := o(env); err != nil {
			return nil, err
		}
	}
	return env, nil
}

// identityInstallTimeout bounds the wait for the identity policies to take
// effect after the control plane started.
const identityInstallTimeout = 2 * time.Minute

// Start starts etcd and kube-apiserver with the CRDs, as envtest does, then
// installs the identity admission policies (unless WithoutIdentityPolicies)
// and waits until the API server stamps claims with them. Like envtest's,
// it leaves the control plane running when a step after its start fails:
// the caller stops it.
func (e *Environment) Start() (*rest.Config, error) {
	cfg, err := e.Environment.Start()
	if err != nil || !e.identity {
		return cfg, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), identityInstallTimeout)
	defer cancel()
	if err := InstallIdentity(ctx, cfg); err != nil {
		return nil, fmt.Errorf("installing the identity admission policies: %w", err)
	}
	return cfg, nil
}

// ManagerOptions configure an in-process manager: the operator's own
// options, whose zero value suits tests.
type ManagerOptions = controller.Options

// DefaultManagerOptions are the operator's defaults (controller.DefaultOptions)
// for the one manager of a process on a developer's machine (`make run`,
// `make demo`): without leader election, and without the metrics and
// probe servers, whose ports may be taken.
func DefaultManagerOptions() ManagerOptions {
	o := controller.DefaultOptions()
	o.LeaderElection = false
	o.MetricsBindAddress, o.HealthProbeBindAddress = "", ""
	return o
}

// InterceptClient returns a NewClient for ManagerOptions that wraps the
// manager's client with funcs (fault injection).
func InterceptClient(funcs interceptor.Funcs) client.NewClientFunc {
	return func(cfg *rest.Config, co client.Options) (client.Client, error) {
		c, err := client.NewWithWatch(cfg, co)
		if err != nil {
			return nil, err
		}
		return interceptor.NewClient(c, funcs), nil
	}
}

// Manager is a running in-process manager.
type Manager struct {
	ctrl.Manager
	cancel   context.CancelFunc
	done     chan error
	stopOnce sync.Once
	stopErr  error
}

// Stop cancels the manager abruptly (as a kill would: nothing is released)
// and waits for it to return. Later calls return what the first returned,
// so a test may stop a manager that a cleanup stops again.
func (m *Manager) Stop() error {
	m.stopOnce.Do(func() {
		m.cancel()
		m.stopErr = <-m.done
	})
	return m.stopErr
}

// StartManager starts the operator's manager against cfg, with the same
// wiring as cmd/manager (controller.NewManager) and test settings: several
// managers may run in one process, each with its own metrics registry, and
// leader election (off unless asked for) hands over within seconds. It
// returns once the manager has synced its caches.
func StartManager(ctx context.Context, cfg *rest.Config, opts ManagerOptions) (*Manager, error) {
	opts.SkipNameValidation = true
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	if opts.LeaderElection {
		opts.LeaderElectionNamespace = cmp.Or(opts.LeaderElectionNamespace, "default")
		opts.LeaseDuration = cmp.Or(opts.LeaseDuration, ptr.To(4*time.Second))
		opts.RenewDeadline = cmp.Or(opts.RenewDeadline, ptr.To(3*time.Second))
		opts.RetryPeriod = cmp.Or(opts.RetryPeriod, ptr.To(500*time.Millisecond))
	}
	mgr, err := controller.NewManager(cfg, opts)
	if err != nil {
		return nil, err
	}
	mctx, cancel := context.WithCancel(ctx)
	m := &Manager{Manager: mgr, cancel: cancel, done: make(chan error, 1)}
	go func() { m.done <- mgr.Start(mctx) }()
	syncCtx, syncCancel := context.WithTimeout(ctx, 30*time.Second)
	defer syncCancel()
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		_ = m.Stop()
		return nil, errors.New("the manager's cache did not sync within 30s")
	}
	return m, nil
}
