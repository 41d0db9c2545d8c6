//go:build bench

package bench

import (
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
)

// counter counts the requests one client makes, by verb and resource
// ("update leases", "update buildlocks/status"), and can record a trace of
// them: what the operator does during one hand-off, and when.
type counter struct {
	mu      sync.Mutex
	counts  map[string]int
	tracing bool
	trace   []traced

	inflight atomic.Int64
	lastDone atomic.Int64 // unix nanoseconds
}

// traced is one request: its verb and resource, when it was sent and when
// its response headers came back.
type traced struct {
	what        string
	start, done time.Time
}

func newCounter() *counter { return &counter{counts: map[string]int{}} }

// wrap returns a copy of cfg whose requests c counts. The copy has no
// client-side rate limit, as the manager's binary (controller-runtime's
// GetConfig leaves the limits to the API server's priority and fairness).
func (c *counter) wrap(cfg *rest.Config) *rest.Config {
	cp := rest.CopyConfig(cfg)
	cp.QPS, cp.Burst = -1, 0
	cp.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			what := classify(req)
			start := time.Now()
			c.inflight.Add(1)
			resp, err := rt.RoundTrip(req)
			done := time.Now()
			c.lastDone.Store(done.UnixNano())
			c.inflight.Add(-1)
			c.mu.Lock()
			c.counts[what]++
			if c.tracing {
				c.trace = append(c.trace, traced{what, start, done})
			}
			c.mu.Unlock()
			return resp, err
		})
	}
	return cp
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// classify names a request as "verb resource[/subresource]".
func classify(req *http.Request) string {
	path := strings.TrimPrefix(req.URL.Path, "/")
	parts := strings.Split(path, "/")
	// /api/v1/... or /apis/group/version/...
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	}
	if len(parts) >= 2 && parts[0] == "namespaces" && len(parts) > 2 {
		parts = parts[2:]
	}
	resource, named := "", false
	if len(parts) > 0 {
		resource = parts[0]
	}
	if len(parts) > 1 {
		named = true
	}
	if len(parts) > 2 {
		resource += "/" + parts[2]
	}
	verb := strings.ToLower(req.Method)
	switch req.Method {
	case http.MethodGet:
		switch {
		case req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1":
			verb = "watch"
		case named:
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodDelete:
		if !named {
			verb = "deletecollection"
		}
	}
	return verb + " " + resource
}

// isWrite says whether a counted key is a write.
func isWrite(key string) bool {
	verb, _, _ := strings.Cut(key, " ")
	switch verb {
	case "create", "update", "patch", "delete", "deletecollection":
		return true
	}
	return false
}

// snapshot returns the counts so far.
func (c *counter) snapshot() counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(counts, len(c.counts))
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}

// startTrace starts recording requests; stopTrace returns them.
func (c *counter) startTrace() {
	c.mu.Lock()
	c.tracing, c.trace = true, nil
	c.mu.Unlock()
}

func (c *counter) stopTrace() []traced {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tracing = false
	return c.trace
}

// quiesce waits until the client has had no request in flight for idle (at
// most limit), so that the work caused by one step is counted in that step.
func (c *counter) quiesce(idle, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if c.inflight.Load() == 0 && time.Since(time.Unix(0, c.lastDone.Load())) >= idle {
			return
		}
		time.Sleep(idle / 4)
	}
}

// counts are request counts by "verb resource".
type counts map[string]int

// minus returns c - base.
func (c counts) minus(base counts) counts {
	out := counts{}
	for k, v := range c {
		if d := v - base[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// plus returns c + o.
func (c counts) plus(o counts) counts {
	out := counts{}
	for k, v := range c {
		out[k] += v
	}
	for k, v := range o {
		out[k] += v
	}
	return out
}

// writes is the number of writes in c.
func (c counts) writes() int {
	n := 0
	for k, v := range c {
		if isWrite(k) {
			n += v
		}
	}
	return n
}

func (c counts) total() int {
	n := 0
	for _, v := range c {
		n += v
	}
	return n
}

// keys returns the keys sorted: writes first, then reads, each by name.
func (c counts) keys() []string {
	ks := make([]string, 0, len(c))
	for k := range c {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool {
		if wi, wj := isWrite(ks[i]), isWrite(ks[j]); wi != wj {
			return wi
		}
		return ks[i] < ks[j]
	})
	return ks
}
