package controller

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

// Options configure the operator: what cmd/manager's flags set, and what
// tests and the local control plane change. DefaultOptions is what the
// flags default to. The zero value is a manager for tests: every namespace,
// no metrics or probe servers, no leader election, the real clock, finished
// claims kept; a setting it leaves at zero whose zero means nothing (the
// grant retention, the clock skew and build jump allowed, the requester
// settle time, the workers) takes its default.
type Options struct {
	// Namespaces to watch for BuildLocks; all when empty (--namespaces).
	Namespaces []string
	// FinishedTTL deletes terminal claims this long after they ended; zero
	// keeps them (--finished-ttl).
	FinishedTTL time.Duration
	// MaxHold bounds every hold of a lock whose BuildLockPolicy sets none;
	// zero means no bound (--max-hold).
	MaxHold time.Duration
	// GrantRetention is how long a grant record remembers which builds of
	// each line held, and how long the Lease of a lock without claims is
	// kept (--grant-retention).
	GrantRetention time.Duration
	// MaxTimestampSkew is how far after its creation a claim's
	// spec.timestamp may place it (--max-timestamp-skew).
	MaxTimestampSkew time.Duration
	// MaxBuildJump is how far above the highest build of its line that held
	// a claim that is not a person's may go (--max-build-jump).
	MaxBuildJump int64
	// RequesterSettle is how long after the buildlock-requester admission
	// policy and its binding were created the operator takes
	// spec.requester as the API server's word: a new admission policy takes
	// effect a moment after it is created (the API server loads and
	// compiles it), and a claim created before could carry a requester its
	// client wrote. Tests shorten it.
	RequesterSettle time.Duration
	// Workers is how many locks are decided at once
	// (--max-concurrent-reconciles). A reconcile waits on the API server
	// for most of its time (a few requests in a row), so the default is
	// sized for that, not for the manager's CPUs.
	Workers int

	// LeaderElection elects one deciding manager among replicas
	// (--leader-elect), with its Lease in LeaderElectionNamespace.
	LeaderElection          bool
	LeaderElectionNamespace string
	// LeaseDuration, RenewDeadline and RetryPeriod tune leader election
	// (controller-runtime's defaults when nil).
	LeaseDuration, RenewDeadline, RetryPeriod *time.Duration

	// MetricsBindAddress serves the metrics; "" or "0" serves none
	// (--metrics-bind-address). SecureMetrics serves them over HTTPS to
	// authenticated and authorized callers only (--metrics-secure), with
	// the certificate in MetricsCertDir or a self-signed one.
	MetricsBindAddress string
	SecureMetrics      bool
	MetricsCertDir     string
	// HealthProbeBindAddress serves /healthz and /readyz; "" or "0" serves
	// none (--health-probe-bind-address).
	HealthProbeBindAddress string

	// Clock defaults to the real clock; tests and chaos runs skew it.
	Clock clock.PassiveClock
	// Decide replaces the arbiter (to break it on purpose); nil uses it.
	Decide func(arbiter.Lock, []arbiter.Claim, arbiter.Grant, time.Time, arbiter.Policy) arbiter.Decision
	// NewClient builds the manager's client (tests wrap it to inject
	// faults); nil uses controller-runtime's.
	NewClient client.NewClientFunc
	// Registry receives the operator's metrics; controller-runtime's
	// global registry (the one the metrics server serves) when nil.
	Registry prometheus.Registerer
	// SkipNameValidation allows several managers in one process (tests).
	SkipNameValidation bool
}

// LocalMetricsBindAddress is where `make run`'s in-process operator serves
// its metrics: over plain HTTP on loopback, for a person on the machine,
// unlike the in-cluster default (HTTPS on :8443).
const LocalMetricsBindAddress = "127.0.0.1:8080"

// DefaultOptions returns the operator's defaults: the one place each is
// defined. cmd/manager's flags default to them, the local control plane
// and the demo run with them, and a chart test holds the chart's values to
// them. The values the API shares (the grant retention, the timestamp
// skew, the build jump) are api/v1alpha1's.
func DefaultOptions() Options {
	return Options{
		FinishedTTL:            time.Hour,
		GrantRetention:         buildlockv1.DefaultGrantRetention,
		MaxTimestampSkew:       buildlockv1.MaxTimestampSkew,
		MaxBuildJump:           buildlockv1.DefaultMaxBuildJump,
		RequesterSettle:        30 * time.Second,
		Workers:                8,
		LeaderElection:         true,
		MetricsBindAddress:     ":8443",
		SecureMetrics:          true,
		HealthProbeBindAddress: ":8081",
	}
}

// complete checks o and fills in, from DefaultOptions, the settings that
// o leaves at a zero that means nothing.
func (o Options) complete() (Options, error) {
	if o.FinishedTTL < 0 || o.MaxHold < 0 || o.GrantRetention < 0 || o.MaxTimestampSkew < 0 || o.MaxBuildJump < 0 {
		return o, errors.New("finished TTL, max hold, grant retention, max timestamp skew and max build jump must not be negative")
	}
	d := DefaultOptions()
	if o.GrantRetention == 0 {
		o.GrantRetention = d.GrantRetention
	}
	if o.MaxTimestampSkew == 0 {
		o.MaxTimestampSkew = d.MaxTimestampSkew
	}
	if o.MaxBuildJump == 0 {
		o.MaxBuildJump = d.MaxBuildJump
	}
	if o.RequesterSettle <= 0 {
		o.RequesterSettle = d.RequesterSettle
	}
	if o.Workers <= 0 {
		o.Workers = d.Workers
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Registry == nil {
		o.Registry = metrics.Registry
	}
	if o.Decide == nil {
		o.Decide = arbiter.Decide
	}
	return o, nil
}

// arbiterDefaults is how a lock is arbitrated where its BuildLockPolicy is
// silent, or when it has none.
func (o Options) arbiterDefaults() arbiter.Policy {
	return arbiter.Policy{Ordering: arbiter.NewestWins, MaxHold: o.MaxHold, LineMemory: o.GrantRetention,
		MaxTimestampSkew: o.MaxTimestampSkew, MaxBuildJump: o.MaxBuildJump}
}
