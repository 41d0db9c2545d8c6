// Command manager runs the buildlock operator: it arbitrates every BuildLock
// in the namespaces it watches and writes each claim's verdict into its
// status.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
	"github.com/buildlock/buildlock/internal/controller"
)

func main() {
	var (
		metricsAddr      string
		probeAddr        string
		leaderElect      bool
		leaderElectionNS string
		namespaces       string
		finishedTTL      time.Duration
		maxHold          time.Duration
		workers          int
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8080", "Address the Prometheus metrics endpoint binds to; \"0\" disables it.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address the /healthz and /readyz probes bind to.")
	flag.BoolVar(&leaderElect, "leader-elect", true, "Elect a leader among replicas, so that one manager decides at a time.")
	flag.StringVar(&leaderElectionNS, "leader-election-namespace", "", "Namespace of the leader-election Lease (default: the pod's namespace).")
	flag.StringVar(&namespaces, "namespaces", "", "Comma-separated namespaces to watch for BuildLocks (default: all).")
	flag.DurationVar(&finishedTTL, "finished-ttl", time.Hour, "Delete claims this long after they became Superseded, Released or Expired; 0 keeps them.")
	flag.DurationVar(&maxHold, "max-hold", 0, "End a pod-backed hold after this long (a Warning event at 80 %); 0 means no limit.")
	flag.IntVar(&workers, "max-concurrent-reconciles", 4, "How many locks are decided at once.")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	log := ctrl.Log.WithName("setup")

	if err := run(options{
		metricsAddr: metricsAddr, probeAddr: probeAddr, leaderElect: leaderElect, leaderElectionNS: leaderElectionNS,
		namespaces: splitList(namespaces), finishedTTL: finishedTTL, maxHold: maxHold, workers: workers,
	}); err != nil {
		log.Error(err, "Manager stopped")
		os.Exit(1)
	}
}

type options struct {
	metricsAddr, probeAddr string
	leaderElect            bool
	leaderElectionNS       string
	namespaces             []string
	finishedTTL, maxHold   time.Duration
	workers                int
}

func run(o options) error {
	if o.finishedTTL < 0 || o.maxHold < 0 {
		return fmt.Errorf("--finished-ttl and --max-hold must not be negative")
	}
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(buildlockv1.AddToScheme(scheme))

	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Cache:                         controller.CacheOptions(o.namespaces),
		Metrics:                       metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress:        o.probeAddr,
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              "buildlock-manager.buildlock.io",
		LeaderElectionNamespace:       o.leaderElectionNS,
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()
	r := &controller.LockReconciler{
		Client:      mgr.GetClient(),
		APIReader:   mgr.GetAPIReader(),
		Recorder:    mgr.GetEventRecorder("buildlock"),
		Clock:       clock.RealClock{},
		Policy:      arbiter.Policy{MaxHold: o.maxHold},
		FinishedTTL: o.finishedTTL,
		Metrics:     controller.NewMetrics(metrics.Registry),
	}
	if err := r.SetupWithManager(ctx, mgr, controller.SetupOptions{MaxConcurrentReconciles: o.workers}); err != nil {
		return fmt.Errorf("setting up the lock controller: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("adding healthz check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return fmt.Errorf("adding readyz check: %w", err)
	}
	ctrl.Log.WithName("setup").Info("Starting manager", "namespaces", o.namespaces, "leaderElect", o.leaderElect,
		"finishedTTL", o.finishedTTL, "maxHold", o.maxHold, "workers", o.workers)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running manager: %w", err)
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}
