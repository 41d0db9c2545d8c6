package controller

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

// Metrics are the operator's Prometheus metrics. Labels carry reasons only,
// never claim names, so their cardinality is fixed.
type Metrics struct {
	waitSeconds   prometheus.Histogram
	holdSeconds   prometheus.Histogram
	grants        prometheus.Counter
	supersessions *prometheus.CounterVec
	releases      *prometheus.CounterVec
	expiries      *prometheus.CounterVec
	locksHeld     prometheus.GaugeFunc

	mu   sync.Mutex
	held map[arbiter.Lock]bool
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	buckets := prometheus.ExponentialBuckets(0.01, 4, 12) // 10ms .. ~11.6h
	m := &Metrics{
		waitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "buildlock_wait_seconds", Help: "Time from a claim's creation until it was granted its lock.", Buckets: buckets,
		}),
		holdSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "buildlock_hold_seconds", Help: "Time a holder kept its lock, from grant to release, expiry or deletion.", Buckets: buckets,
		}),
		grants: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "buildlock_grants_total", Help: "Locks granted.",
		}),
		supersessions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buildlock_supersessions_total", Help: "Claims superseded, by reason.",
		}, []string{"reason"}),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buildlock_releases_total", Help: "Claims released (holders and waiters), by reason.",
		}, []string{"reason"}),
		expiries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buildlock_expiries_total", Help: "Holds that expired, by reason.",
		}, []string{"reason"}),
		held: map[arbiter.Lock]bool{},
	}
	m.locksHeld = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "buildlock_locks_held", Help: "Locks that have a holder, as last decided by this manager.",
	}, m.countHeld)
	reg.MustRegister(m.waitSeconds, m.holdSeconds, m.grants, m.supersessions, m.releases, m.expiries, m.locksHeld)
	return m
}

func (m *Metrics) countHeld() float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return float64(len(m.held))
}

// observeDecision records a decision that was applied in full.
func (m *Metrics) observeDecision(lock arbiter.Lock, obs observation, d arbiter.Decision, now time.Time) {
	if m == nil {
		return
	}
	m.mu.Lock()
	if d.Holder != "" {
		m.held[lock] = true
	} else {
		delete(m.held, lock)
	}
	m.mu.Unlock()

	if !d.GrantChanged {
		return
	}
	// A holder that was deleted has no verdict; its hold ends here.
	before := grantFromLease(obs.lease)
	if before.Holder != "" && !hasClaim(obs.claims, before.Holder) && !before.AcquiredAt.IsZero() {
		m.holdSeconds.Observe(now.Sub(before.AcquiredAt).Seconds())
		m.releases.WithLabelValues("Deleted").Inc()
	}
}

// observeTransition records one claim's change of phase.
func (m *Metrics) observeTransition(bl *buildlockv1.BuildLock, v arbiter.Verdict, now time.Time) {
	if m == nil {
		return
	}
	switch v.Phase {
	case arbiter.Held:
		m.grants.Inc()
		m.waitSeconds.Observe(now.Sub(bl.CreationTimestamp.Time).Seconds())
	case arbiter.Superseded:
		m.supersessions.WithLabelValues(v.Reason).Inc()
	case arbiter.Released:
		m.releases.WithLabelValues(v.Reason).Inc()
	case arbiter.Expired:
		m.expiries.WithLabelValues(v.Reason).Inc()
	}
	if v.From == arbiter.Held && bl.Status.AcquiredAt != nil {
		m.holdSeconds.Observe(now.Sub(bl.Status.AcquiredAt.Time).Seconds())
	}
}

func hasClaim(claims []buildlockv1.BuildLock, name string) bool {
	for i := range claims {
		if claims[i].Name == name {
			return true
		}
	}
	return false
}
