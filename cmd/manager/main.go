// Command manager runs the buildlock operator: it arbitrates every BuildLock
// in the namespaces it watches and writes each claim's verdict into its
// status. It only parses flags: the wiring is controller.NewManager, which
// the tests and the local control plane share.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/buildlock/buildlock/internal/controller"
)

func main() {
	var (
		o          = controller.DefaultOptions()
		namespaces string
		zapOpts    zap.Options
	)
	bindFlags(flag.CommandLine, &o, &namespaces, &zapOpts)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	o.Namespaces = splitList(namespaces)

	if err := run(o); err != nil {
		ctrl.Log.WithName("setup").Error(err, "Manager stopped")
		os.Exit(1)
	}
}

func run(o controller.Options) error {
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	mgr, err := controller.NewManager(cfg, o)
	if err != nil {
		return err
	}
	ctrl.Log.WithName("setup").Info("Starting manager", "namespaces", o.Namespaces, "leaderElect", o.LeaderElection,
		"finishedTTL", o.FinishedTTL, "maxHold", o.MaxHold, "grantRetention", o.GrantRetention,
		"maxTimestampSkew", o.MaxTimestampSkew, "maxBuildJump", o.MaxBuildJump, "workers", o.Workers,
		"metrics", o.MetricsBindAddress, "metricsSecure", o.SecureMetrics)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
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

// bindFlags defines the manager's flags on fs, controller-runtime's logging
// flags among them. Each sets a field of o and defaults to the value o holds
// (controller.DefaultOptions in main); docs/operations.md documents them, and
// a test holds its table to them.
func bindFlags(fs *flag.FlagSet, o *controller.Options, namespaces *string, zapOpts *zap.Options) {
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", o.MetricsBindAddress, "Address the Prometheus metrics endpoint binds to; \"0\" disables it.")
	fs.BoolVar(&o.SecureMetrics, "metrics-secure", o.SecureMetrics, "Serve the metrics over HTTPS to authenticated and authorized callers only (a TokenReview and a SubjectAccessReview for GET /metrics); false serves plain HTTP.")
	fs.StringVar(&o.MetricsCertDir, "metrics-cert-dir", o.MetricsCertDir, "Directory with tls.crt and tls.key for the metrics endpoint; a self-signed certificate when empty.")
	fs.StringVar(&o.HealthProbeBindAddress, "health-probe-bind-address", o.HealthProbeBindAddress, "Address the /healthz and /readyz probes bind to.")
	fs.BoolVar(&o.LeaderElection, "leader-elect", o.LeaderElection, "Elect a leader among replicas, so that one manager decides at a time.")
	fs.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", o.LeaderElectionNamespace, "Namespace of the leader-election Lease (default: the pod's namespace).")
	fs.StringVar(namespaces, "namespaces", "", "Comma-separated namespaces to watch for BuildLocks (default: all).")
	fs.DurationVar(&o.FinishedTTL, "finished-ttl", o.FinishedTTL, "Delete claims this long after they became Superseded, Released or Expired; 0 keeps them.")
	fs.DurationVar(&o.MaxHold, "max-hold", o.MaxHold, "End every hold (with a pod or without) this long after its grant, with a Warning event at 80 %, unless the lock's BuildLockPolicy sets spec.maxHold; 0 means no limit.")
	fs.DurationVar(&o.GrantRetention, "grant-retention", o.GrantRetention, "How long a lock's grant Lease remembers which builds of each line held it (a lower build never deploys after a higher one within this time), and how long the Lease of a target without claims is kept.")
	fs.DurationVar(&o.MaxTimestampSkew, "max-timestamp-skew", o.MaxTimestampSkew, "How far after its creation a claim's spec.timestamp may place it when builds of different lines are ordered (a later stamp counts as creation plus this): the clock skew allowed to clients.")
	fs.Int64Var(&o.MaxBuildJump, "max-build-jump", o.MaxBuildJump, "How far above the highest build of its line that held the lock (within --grant-retention) a claim that is not a person's may go; a claim above is Superseded (BuildJumpTooLarge).")
	fs.IntVar(&o.Workers, "max-concurrent-reconciles", o.Workers, "How many locks are decided at once.")
	zapOpts.BindFlags(fs)
}
