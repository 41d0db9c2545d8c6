package controller

import (
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
	"github.com/buildlock/buildlock/internal/controller/grant"
)

// MaxLockSeries bounds the per-lock series (labeled namespace and target):
// a manager exports them for at most this many locks, those held longest
// first, so that a namespace with thousands of throw-away targets cannot
// flood Prometheus. Locks with neither holder nor waiting claim have none.
const MaxLockSeries = 500

// Metrics are the operator's Prometheus metrics. Counters and histograms
// carry reasons only, never claim names, so their cardinality is fixed; the
// per-lock gauges carry namespace and target, bounded by MaxLockSeries.
type Metrics struct {
	waitSeconds      prometheus.Histogram
	holdSeconds      prometheus.Histogram
	grants           prometheus.Counter
	grantWriteErrors prometheus.Counter
	grantRepairs     *prometheus.CounterVec
	supersessions    *prometheus.CounterVec
	releases         *prometheus.CounterVec
	expiries         *prometheus.CounterVec
	rollbacks        *prometheus.CounterVec
	overrides        prometheus.Counter

	clock clock.PassiveClock
	mu    sync.Mutex
	locks map[arbiter.Lock]lockState
}

// lockState is what the per-lock gauges report of one lock, as last decided
// by this manager.
type lockState struct {
	heldSince   time.Time // zero when free
	waiting     int
	oldestSince time.Time // when the oldest waiting claim was created
}

var (
	lockLabels       = []string{"namespace", "target"}
	locksHeldDesc    = prometheus.NewDesc("buildlock_locks_held", "Locks that have a holder, as last decided by this manager.", nil, nil)
	holdAgeDesc      = prometheus.NewDesc("buildlock_lock_hold_age_seconds", "How long the current holder of the lock has held it.", lockLabels, nil)
	waitAgeDesc      = prometheus.NewDesc("buildlock_lock_wait_age_seconds", "How long the oldest waiting claim of the lock has waited, since its creation.", lockLabels, nil)
	waitingCountDesc = prometheus.NewDesc("buildlock_lock_waiting", "Claims waiting for the lock.", lockLabels, nil)
)

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
		grantWriteErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "buildlock_grant_write_errors_total", Help: "Grant Lease writes that failed other than by losing a race to another writer.",
		}),
		grantRepairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buildlock_grant_repairs_total",
			Help: "Grant records restored from the claims after someone else deleted or edited them, by what was restored (Recreated, Holder, Token, Writer, Lines).",
		}, []string{"repair"}),
		supersessions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buildlock_supersessions_total", Help: "Claims superseded, by reason.",
		}, []string{"reason"}),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buildlock_releases_total", Help: "Claims released (holders and waiters), by reason.",
		}, []string{"reason"}),
		expiries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buildlock_expiries_total", Help: "Holds that expired, by reason.",
		}, []string{"reason"}),
		rollbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buildlock_rollbacks_total",
			Help: "Rollbacks (spec.rollback) granted, by who asked as the API server verified it (person, pipeline, or unverified).",
		}, []string{"requester"}),
		overrides: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "buildlock_overrides_total", Help: "Claims granted through a freeze by a person's override (kubectl buildlock override).",
		}),
		clock: clock.RealClock{},
		locks: map[arbiter.Lock]lockState{},
	}
	reg.MustRegister(m.waitSeconds, m.holdSeconds, m.grants, m.grantWriteErrors, m.grantRepairs, m.supersessions, m.releases, m.expiries, m.rollbacks, m.overrides, lockCollector{m})
	return m
}

// lockCollector exports the per-lock gauges from the last decision of each
// lock, aged at collection time.
type lockCollector struct{ m *Metrics }

// Describe sends the descriptions of the per-lock gauges.
func (c lockCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- locksHeldDesc
	ch <- holdAgeDesc
	ch <- waitAgeDesc
	ch <- waitingCountDesc
}

// Collect sends the per-lock gauges, aged to now.
func (c lockCollector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	m.mu.Lock()
	type entry struct {
		lock  arbiter.Lock
		state lockState
	}
	entries := make([]entry, 0, len(m.locks))
	held := 0
	for lock, s := range m.locks {
		entries = append(entries, entry{lock, s})
		if !s.heldSince.IsZero() {
			held++
		}
	}
	m.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(locksHeldDesc, prometheus.GaugeValue, float64(held))
	// The longest holds (then the longest waits) first, up to the bound.
	since := func(s lockState) time.Time {
		if s.heldSince.IsZero() {
			return s.oldestSince
		}
		return s.heldSince
	}
	slices.SortFunc(entries, func(a, b entry) int { return since(a.state).Compare(since(b.state)) })
	now := m.clock.Now()
	for _, e := range entries[:min(len(entries), MaxLockSeries)] {
		labels := []string{e.lock.Namespace, e.lock.Target}
		if !e.state.heldSince.IsZero() {
			ch <- prometheus.MustNewConstMetric(holdAgeDesc, prometheus.GaugeValue, now.Sub(e.state.heldSince).Seconds(), labels...)
		}
		ch <- prometheus.MustNewConstMetric(waitingCountDesc, prometheus.GaugeValue, float64(e.state.waiting), labels...)
		if e.state.waiting > 0 {
			ch <- prometheus.MustNewConstMetric(waitAgeDesc, prometheus.GaugeValue, now.Sub(e.state.oldestSince).Seconds(), labels...)
		}
	}
}

// observeDecision records a decision that was applied in full.
func (m *Metrics) observeDecision(lock arbiter.Lock, obs observation, d arbiter.Decision, now time.Time) {
	if m == nil {
		return
	}
	state := lockState{waiting: d.Queued}
	if d.Holder != "" {
		state.heldSince = d.Grant.AcquiredAt
	}
	waiting := map[string]bool{}
	for _, v := range d.Verdicts {
		if v.Phase == arbiter.Waiting {
			waiting[v.Name] = true
		}
	}
	for i := range obs.claims {
		if bl := &obs.claims[i]; waiting[bl.Name] {
			if created := bl.CreationTimestamp.Time; state.oldestSince.IsZero() || created.Before(state.oldestSince) {
				state.oldestSince = created
			}
		}
	}
	m.mu.Lock()
	if state.heldSince.IsZero() && state.waiting == 0 {
		delete(m.locks, lock)
	} else {
		m.locks[lock] = state
	}
	m.mu.Unlock()

	if !d.GrantChanged {
		return
	}
	// A holder that was deleted has no verdict; its hold ends here.
	before := grant.FromLease(obs.lease)
	if before.Holder != "" && !hasClaim(obs.claims, before.Holder) && !before.AcquiredAt.IsZero() {
		m.holdSeconds.Observe(now.Sub(before.AcquiredAt).Seconds())
		m.releases.WithLabelValues("Deleted").Inc()
	}
}

// observeGrantWriteError counts a failed grant write that was not a lost
// race (those are normal: the lock is decided again).
func (m *Metrics) observeGrantWriteError() {
	if m == nil {
		return
	}
	m.grantWriteErrors.Inc()
}

// observeRepair counts a grant record restored from the claims.
func (m *Metrics) observeRepair(repair string) {
	if m == nil {
		return
	}
	m.grantRepairs.WithLabelValues(repair).Inc()
}

// observeTransition records one claim's change of phase.
func (m *Metrics) observeTransition(bl *buildlockv1.BuildLock, v arbiter.Verdict, now time.Time) {
	if m == nil {
		return
	}
	switch v.Phase {
	case arbiter.Held:
		m.grants.Inc()
		if v.Overridden {
			m.overrides.Inc()
		}
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

// observeRollback counts a rollback granted to a claim whose verified
// requester is identity ("" if unverified), a CI identity if ci.
func (m *Metrics) observeRollback(identity string, ci bool) {
	if m == nil {
		return
	}
	requester := "unverified"
	switch {
	case arbiter.IsPipeline(identity, ci):
		requester = "pipeline"
	case identity != "":
		requester = "person"
	}
	m.rollbacks.WithLabelValues(requester).Inc()
}

func hasClaim(claims []buildlockv1.BuildLock, name string) bool {
	for i := range claims {
		if claims[i].Name == name {
			return true
		}
	}
	return false
}
