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
}

var enforcedLocksDesc = prometheus.NewDesc("buildlock_enforced_locks",
	"Locks whose policy enforces them, by the reason of their Enforced condition (FenceFrozen: admission enforces an old grant), as last probed by this manager.",
	[]string{"reason"}, nil)

// newFenceMetrics creates the fence metrics and registers them with reg.
func newFenceMetrics(reg prometheus.Registerer) *fenceMetrics {
	m := &fenceMetrics{
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buildlock_fence_probes_total",
			Help: "Probe writes into enforced targets, by what the API server did: refused, admitted, paramMissing or failed.",
		}, []string{"result"}),
		reasons: map[arbiter.Lock]string{},
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

// fenceCollector exports buildlock_enforced_locks.
type fenceCollector struct{ m *fenceMetrics }

// Describe sends the gauge's description.
func (c fenceCollector) Describe(ch chan<- *prometheus.Desc) { ch <- enforcedLocksDesc }

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
}
