// Package testenv starts the real control plane the tests run against (etcd
// and kube-apiserver, built into bin/k8s by `make envtest`) with the
// BuildLock CRD installed, and runs the operator's manager in-process. The
// controller, plugin, chaos and benchmark tests and the local cluster of
// `make run` share it, so that they all exercise the same wiring as
// cmd/manager.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
	"github.com/buildlock/buildlock/internal/controller"
)

// K8sVersion is the version of the control-plane binaries under bin/k8s.
const K8sVersion = "1.37.2"

// Scheme returns a scheme with the built-in kinds and BuildLock.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(buildlockv1.AddToScheme(s))
	return s
}

// RepoRoot finds the repository root (the directory holding go.mod) from the
// working directory upwards, so that tests in any package find the CRDs and
// binaries.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding the working directory: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(dir, "config", "crd", "bases")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod with config/crd/bases above the working directory")
		}
		dir = parent
	}
}

// New returns an envtest environment with the BuildLock CRD, using the
// binaries in KUBEBUILDER_ASSETS or else bin/k8s/<version>.
func New() (*envtest.Environment, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		Scheme:                Scheme(),
	}
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		env.BinaryAssetsDirectory = filepath.Join(root, "bin", "k8s", K8sVersion)
	}
	return env, nil
}

// ManagerOptions configure an in-process manager.
type ManagerOptions struct {
	// Namespaces to watch; all when empty.
	Namespaces []string
	// FinishedTTL and Policy as the manager's flags; zero values keep
	// finished claims and set no max hold.
	FinishedTTL time.Duration
	Policy      arbiter.Policy
	// Clock defaults to the real clock.
	Clock clock.PassiveClock
	// Decide replaces the arbiter (to break it on purpose); nil uses it.
	Decide func(arbiter.Lock, []arbiter.Claim, arbiter.Grant, time.Time, arbiter.Policy) arbiter.Decision
	// Interceptor, when set, wraps the manager's client (fault injection).
	Interceptor *interceptor.Funcs
	// Workers is MaxConcurrentReconciles (default 4).
	Workers int
	// LeaderElection enables leader election (off by default in tests, so
	// that several managers can run at once).
	LeaderElection bool
	// Registry receives the operator's metrics; a fresh one when nil.
	Registry prometheus.Registerer
}

// Manager is a running in-process manager.
type Manager struct {
	ctrl.Manager
	cancel context.CancelFunc
	done   chan error
}

// Stop cancels the manager abruptly (as a kill would: nothing is released)
// and waits for it to return.
func (m *Manager) Stop() error {
	m.cancel()
	return <-m.done
}

// StartManager starts the operator's manager against cfg and returns once it
// has started its caches.
func StartManager(ctx context.Context, cfg *rest.Config, o ManagerOptions) (*Manager, error) {
	opts := ctrl.Options{
		Scheme:                  Scheme(),
		Cache:                   controller.CacheOptions(o.Namespaces),
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:  "0",
		LeaderElection:          o.LeaderElection,
		LeaderElectionID:        "buildlock-manager.buildlock.io",
		LeaderElectionNamespace: "default",
		// Leader election in tests must hand over quickly.
		LeaseDuration: ptr.To(4 * time.Second),
		RenewDeadline: ptr.To(3 * time.Second),
		RetryPeriod:   ptr.To(500 * time.Millisecond),
	}
	if o.Interceptor != nil {
		funcs := *o.Interceptor
		opts.NewClient = func(cfg *rest.Config, co client.Options) (client.Client, error) {
			c, err := client.NewWithWatch(cfg, co)
			if err != nil {
				return nil, err
			}
			return interceptor.NewClient(c, funcs), nil
		}
	}
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	mctx, cancel := context.WithCancel(ctx)
	r := &controller.LockReconciler{
		Client:      mgr.GetClient(),
		APIReader:   mgr.GetAPIReader(),
		Recorder:    mgr.GetEventRecorder("buildlock"),
		Clock:       o.Clock,
		Policy:      o.Policy,
		FinishedTTL: o.FinishedTTL,
		Decide:      o.Decide,
		Metrics:     controller.NewMetrics(o.Registry),
	}
	workers := o.Workers
	if workers == 0 {
		workers = 4
	}
	if err := r.SetupWithManager(mctx, mgr, controller.SetupOptions{MaxConcurrentReconciles: workers, SkipNameValidation: true}); err != nil {
		cancel()
		return nil, fmt.Errorf("setting up the lock controller: %w", err)
	}
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
