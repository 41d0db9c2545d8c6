package policy

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

// fenceMetrics are the fence probe's metrics.
type fenceMetrics struct {
	probes  *prometheus.CounterVec
	mu      sync.Mutex
	reasons map[arbiter.Lock]string
	// frozen says, of each lock whose policy has windows, whether they
	// freeze it.
	frozen map[arbiter.Lock]bool
}

var enforcedLocksDesc = prometheus.NewDesc("buildlock_enforced_locks",
	"Locks whose policy enforces them, by the reason of their Enforced condition (FenceFrozen: admission enforces an old grant), as last probed by this manager.",
	[]string{"reason"}, nil)

var lockFrozenDesc = prometheus.NewDesc("buildlock_lock_frozen",
	"1 while the lock's deploy windows freeze its target, 0 while it is open; only locks whose policy has windows.",
	[]string{"namespace", "target"}, nil)

// newFenceMetrics creates the fence metrics and registers them with reg.
func newFenceMetrics(reg prometheus.Registerer) *fenceMetrics {
	m := &fenceMetrics{
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buildlock_fence_probes_total",
			Help: "Probe writes into enforced targets, by what the API server did: refused, admitted, paramMissing or failed.",
		}, []string{"result"}),
		reasons: map[arbiter.Lock]string{},
		frozen:  map[arbiter.Lock]bool{},
	}
	reg.MustRegister(m.probes, fenceCollector{m})
	return m
}

// observeProbe counts a probe by its result.
func (m *fenceMetrics) observeProbe(result string) {
	m.probes.WithLabelValues(result).Inc()
}

// set records the lock's Enforced reason; "" forgets the lock.
func (m *fenceMetrics) set(lock arbiter.Lock, reason string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if reason == "" {
		delete(m.reasons, lock)
		return
	}
	m.reasons[lock] = reason
}

// setFrozen records whether the lock is frozen; a lock without windows is
// forgotten.
func (m *fenceMetrics) setFrozen(lock arbiter.Lock, windows, frozen bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !windows {
		delete(m.frozen, lock)
		return
	}
	m.frozen[lock] = frozen
}

// fenceCollector exports buildlock_enforced_locks.
type fenceCollector struct{ m *fenceMetrics }

// Describe sends the gauge's description.
func (c fenceCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- enforcedLocksDesc
	ch <- lockFrozenDesc
}

// Collect sends the number of enforced locks by reason; FenceFrozen always,
// so that an alert on it has a series to compare.
func (c fenceCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	counts := map[string]int{buildlockv1.ReasonFenceFrozen: 0}
	for _, reason := range c.m.reasons {
		counts[reason]++
	}
	c.m.mu.Unlock()
	for reason, n := range counts {
		ch <- prometheus.MustNewConstMetric(enforcedLocksDesc, prometheus.GaugeValue, float64(n), reason)
	}
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	for lock, frozen := range c.m.frozen {
		v := 0.0
		if frozen {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(lockFrozenDesc, prometheus.GaugeValue, v, lock.Namespace, lock.Target)
	}
}
