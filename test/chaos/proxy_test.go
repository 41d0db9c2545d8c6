package chaos

import (
	"net"
	"sync"
	"time"
)

// partitionProxy is a TCP proxy between one manager and its API server that
// the test can make slow (every chunk of data is delayed by an added
// latency, in both directions), blackhole (nothing flows: open connections
// hang, new ones are accepted and hang too) and heal: either resume (what
// was held back is delivered, late: a partitioned manager's requests, sent
// before the partition, reach the API server after it healed) or reset
// (every connection is closed, as when the client's health checks gave up:
// the manager reconnects, and its watches resume from where they were).
type partitionProxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	latency time.Duration
	hole    chan struct{} // non-nil while blackholed; closed on heal
	conns   map[net.Conn]struct{}
	closed  bool
}

func newPartitionProxy(target string) (*partitionProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &partitionProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go p.serve()
	return p, nil
}

// addr is where clients connect.
func (p *partitionProxy) addr() string { return p.ln.Addr().String() }

// slow adds d to every chunk's delivery, in both directions.
func (p *partitionProxy) slow(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
}

// blackhole stops all traffic until heal.
func (p *partitionProxy) blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hole == nil {
		p.hole = make(chan struct{})
	}
}

// heal ends a blackhole and removes the added latency. With reset, every
// connection open through the proxy is closed.
func (p *partitionProxy) heal(reset bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = 0
	if p.hole != nil {
		close(p.hole)
		p.hole = nil
	}
	if reset {
		for c := range p.conns {
			_ = c.Close()
		}
	}
}

// close stops the proxy and closes its connections.
func (p *partitionProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.heal(true)
}

// gate returns what a chunk read at `at` must wait for: its due time, and
// the blackhole (nil when there is none).
func (p *partitionProxy) gate(at time.Time) (time.Time, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return at.Add(p.latency), p.hole
}

func (p *partitionProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *partitionProxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

func (p *partitionProxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.handle(client)
	}
}

func (p *partitionProxy) handle(client net.Conn) {
	if !p.track(client) {
		_ = client.Close()
		return
	}
	defer p.untrack(client)
	// A connection opened during a blackhole hangs until it heals.
	if _, hole := p.gate(time.Now()); hole != nil {
		<-hole
	}
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = client.Close()
		return
	}
	if !p.track(server) {
		_ = client.Close()
		_ = server.Close()
		return
	}
	defer p.untrack(server)
	var wg sync.WaitGroup
	wg.Go(func() { p.pipe(server, client) })
	wg.Go(func() { p.pipe(client, server) })
	wg.Wait()
}

// chunk is data read from one side, and when.
type chunk struct {
	data []byte
	at   time.Time
}

// pipe copies src to dst, each chunk delivered no earlier than the latency
// after it was read and never during a blackhole. When either side fails,
// both are closed.
func (p *partitionProxy) pipe(dst, src net.Conn) {
	chunks := make(chan chunk, 64)
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				chunks <- chunk{data: buf[:n], at: time.Now()}
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		_ = dst.Close()
		_ = src.Close()
		// Drain, so that the reader ends.
		for c := range chunks {
			_ = c
		}
	}()
	for c := range chunks {
		for {
			due, hole := p.gate(c.at)
			if hole != nil {
				<-hole
				continue
			}
			if wait := time.Until(due); wait > 0 {
				time.Sleep(wait)
				continue // the latency may have changed meanwhile
			}
			break
		}
		if _, err := dst.Write(c.data); err != nil {
			return
		}
	}
}
