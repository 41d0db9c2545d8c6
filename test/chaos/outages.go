package chaos

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// This file follows when the operator could act at all, so that the rules
// that give it time to react (hold-bounded, grant-record-repaired,
// deleted-claim-ends) do not count the time in which no manager could write
// against it: an outage. The run tells the checker what it did to the
// managers and the control plane (the managers it started and killed, which
// API server each talks to, the partitions that cut one off, the API
// servers and etcd it killed and when they answered again); the
// leader-election Lease, read from the checker's own watch, says which
// stretches a leader held while leader election was on.

// ElectionLease is the name of the operator's leader-election Lease (in the
// managers' namespace): while leader election is on, only the manager it
// names decides, from its acquireTime for as long as it renews it.
const ElectionLease = "buildlock-manager.buildlock.io"

// span is a stretch of real time, [from, to); an open one has no to yet.
type span struct {
	from, to time.Time
	why      string
}

func (s span) end(now time.Time) time.Time {
	if s.to.IsZero() {
		return now
	}
	return s.to
}

// managerState is what the run told of one manager.
type managerState struct {
	server string
	// elected: the manager decides only while the election Lease names it.
	elected bool
	// cut: its traffic is held back (a blackhole partition) or it is frozen.
	cut bool
}

// operatorState follows, in real time, whether some manager could act: one
// that runs (its cache synced), reaches its API server (up, with etcd up),
// is not cut off or frozen, and decides: without leader election, or
// leading by the election Lease.
type operatorState struct {
	// tracking: the run reports its managers (a run that never does, such
	// as the checker's own tests of other rules, gets no allowance).
	tracking bool
	managers map[string]*managerState
	down     map[string]bool // API servers killed and not answering yet
	etcdDown bool
	// bare are the stretches in which no manager outside leader election
	// could act (the last one open while that lasts); terms the stretches
	// in which the election Lease shows a leader, from its acquireTime to
	// its latest renewTime (so the time since a leader's last renewal
	// counts as leaderless while it lasts, and for good once another
	// leader acquires the Lease or it is released).
	bare  []span
	terms []span
	// holder and acquired are the current term's.
	holder   string
	acquired time.Time
	// planeDown: stretches in which an API server or etcd was down (the
	// last one open while one is); for the report and for calls that
	// judge whether a refusal came from an API server just started.
	planeDown []span
	// electionVersions counts the versions of the election Lease seen.
	electionVersions int
	// blindSince is, per kind, since when the checker's own watch of it
	// has not been delivering (absent: it is); blind the stretches of a
	// second or more in which one was not: the checker's view of a hold
	// or a Lease is stale then, and a reaction may have come unseen.
	blindSince map[string]time.Time
	blind      []span
}

// minBlind is the shortest stretch without a watch that counts (a watch
// ends every 5-20 s and the next starts at once).
const minBlind = time.Second

func newOperatorState() operatorState {
	return operatorState{managers: map[string]*managerState{}, down: map[string]bool{}, blindSince: map[string]time.Time{}}
}

// acting names a manager outside leader election that can act now ("" if
// none), and says why none can.
func (s *operatorState) acting() (string, string) {
	var why []string
	names := make([]string, 0, len(s.managers))
	for name := range s.managers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		m := s.managers[name]
		switch {
		case m.elected:
			why = append(why, name+" under leader election")
		case m.cut:
			why = append(why, name+" cut off")
		case s.etcdDown:
			why = append(why, name+": etcd down")
		case s.down[m.server]:
			why = append(why, name+": "+m.server+" down")
		default:
			return name, ""
		}
	}
	if len(why) == 0 {
		return "", "no manager running"
	}
	return "", strings.Join(why, ", ")
}

// update opens or closes the current bare stretch at now.
func (s *operatorState) update(now time.Time) {
	if !s.tracking {
		return
	}
	name, why := s.acting()
	open := len(s.bare) > 0 && s.bare[len(s.bare)-1].to.IsZero()
	switch {
	case name != "" && open:
		s.bare[len(s.bare)-1].to = now
	case name == "" && !open:
		s.bare = append(s.bare, span{from: now, why: why})
	}
}

func (s *operatorState) updatePlane(now time.Time) {
	anyDown := s.etcdDown
	for _, d := range s.down {
		anyDown = anyDown || d
	}
	open := len(s.planeDown) > 0 && s.planeDown[len(s.planeDown)-1].to.IsZero()
	switch {
	case !anyDown && open:
		s.planeDown[len(s.planeDown)-1].to = now
	case anyDown && !open:
		s.planeDown = append(s.planeDown, span{from: now})
	}
}

// observeElection follows the election Lease: a new holder (or a new
// acquireTime) starts a term at its acquireTime, a renewal extends the
// current term to its renewTime, a release (no holder) or a deletion ends
// it. The Lease's times are the leader's real clock.
func (s *operatorState) observeElection(typ watch.EventType, l *coordinationv1.Lease) {
	s.electionVersions++
	holder := ""
	if l.Spec.HolderIdentity != nil && typ != watch.Deleted {
		holder = *l.Spec.HolderIdentity
	}
	var acquired, renewed time.Time
	if l.Spec.AcquireTime != nil {
		acquired = l.Spec.AcquireTime.Time
	}
	if l.Spec.RenewTime != nil {
		renewed = l.Spec.RenewTime.Time
	}
	switch {
	case holder == "":
		s.holder, s.acquired = "", time.Time{}
	case holder != s.holder || !acquired.Equal(s.acquired):
		from := acquired
		if n := len(s.terms); n > 0 && s.terms[n-1].to.After(from) {
			from = s.terms[n-1].to // terms never overlap
		}
		s.terms = append(s.terms, span{from: from, to: later(from, renewed), why: holder})
		s.holder, s.acquired = holder, acquired
	default:
		last := &s.terms[len(s.terms)-1]
		last.to = later(last.to, renewed)
	}
}

// outages returns the stretches within [from, to) in which no manager could
// act: the bare stretches, less the election terms.
func (s *operatorState) outages(from, to time.Time) []span {
	var out []span
	for i := len(s.bare) - 1; i >= 0; i-- {
		b := s.bare[i]
		if !b.end(to).After(from) {
			break // the stretches are in order and disjoint
		}
		lo, hi := later(b.from, from), earlier(b.end(to), to)
		if !hi.After(lo) {
			continue
		}
		out = append(out, subtract(span{from: lo, to: hi, why: b.why}, s.terms)...)
	}
	slices.Reverse(out)
	return out
}

// unseen is how long, within [from, to), no manager could act or the
// checker could not see what it did (its own watches down): the union of
// the outages and the blind stretches.
func (s *operatorState) unseen(from, to time.Time) time.Duration {
	spans := s.outages(from, to)
	for i := len(s.blind) - 1; i >= 0; i-- {
		b := s.blind[i]
		if !b.to.After(from) {
			break
		}
		if lo, hi := later(b.from, from), earlier(b.to, to); hi.After(lo) {
			spans = append(spans, span{from: lo, to: hi})
		}
	}
	for _, since := range s.blindSince {
		if lo := later(since, from); to.After(lo) {
			spans = append(spans, span{from: lo, to: to})
		}
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].from.Before(spans[j].from) })
	var d time.Duration
	var end time.Time
	for _, sp := range spans {
		lo := later(sp.from, end)
		if sp.to.After(lo) {
			d += sp.to.Sub(lo)
		}
		end = later(end, sp.to)
	}
	return d
}

// subtract returns what of b no term covers.
func subtract(b span, terms []span) []span {
	out := []span{b}
	for _, t := range terms {
		if !t.to.After(b.from) || !t.from.Before(b.to) {
			continue
		}
		var next []span
		for _, o := range out {
			if lo := o.from; t.from.After(lo) {
				next = append(next, span{from: lo, to: earlier(t.from, o.to), why: o.why})
			}
			if hi := o.to; t.to.Before(hi) {
				next = append(next, span{from: later(t.to, o.from), to: hi, why: o.why})
			}
		}
		out = slices.DeleteFunc(next, func(s span) bool { return !s.to.After(s.from) })
	}
	return out
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// ManagerUp tells the checker that the run started manager name against
// API server server and that its cache has synced; elected says it decides
// only while it leads (leader election on). From the first call on, the
// checker allows the operator's reactions the time in which no manager
// could act.
func (c *Checker) ManagerUp(name, server string, elected bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.op.tracking = true
	c.op.managers[name] = &managerState{server: server, elected: elected}
	what := name + " up on " + server
	if elected {
		what += " (leader election)"
	}
	c.noteRun(what)
}

// noteRun records what the run did to the operator or the control plane in
// the history (a failing run's history shows it), and opens or closes an
// outage. Call with c.mu held.
func (c *Checker) noteRun(what string) {
	now := c.realNow()
	c.op.updatePlane(now)
	c.op.update(now)
	if _, why := c.op.acting(); why != "" && c.op.tracking {
		what += "; no manager outside leader election can act: " + why
	}
	c.record(Entry{At: c.o.Now(), Kind: "Run", What: what})
}

// ManagerDown tells the checker that the run killed manager name (or is
// about to).
func (c *Checker) ManagerDown(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.op.managers, name)
	c.noteRun(name + " down")
}

// ManagerCut tells the checker that the run cut manager name off from its
// API server (a blackhole partition) or froze it, or (cut false) let it go
// on.
func (c *Checker) ManagerCut(name string, cut bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.op.managers[name]; m != nil {
		m.cut = cut
	}
	what := name + " cut off"
	if !cut {
		what = name + " back"
	}
	c.noteRun(what)
}

// APIServerDown tells the checker that the run killed API server name;
// APIServerUp that it answers (ready) again.
func (c *Checker) APIServerDown(name string) { c.setPlane(name, true) }

// APIServerUp tells the checker that API server name answers again.
func (c *Checker) APIServerUp(name string) { c.setPlane(name, false) }

// EtcdDown tells the checker that the run killed etcd (no API server
// answers then); EtcdUp that it is healthy again.
func (c *Checker) EtcdDown() { c.setPlane("", true) }

// EtcdUp tells the checker that etcd is healthy again.
func (c *Checker) EtcdUp() { c.setPlane("", false) }

func (c *Checker) setPlane(server string, down bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if server == "" {
		c.op.etcdDown = down
		server = "etcd"
	} else {
		c.op.down[server] = down
	}
	what := server + " answers again"
	if down {
		what = server + " killed"
	}
	c.noteRun(what)
}

// ControlPlaneSteady reports whether every API server and etcd answered
// throughout the last d: a refusal that an API server sends while it
// starts (its authorizer or its admission policies not yet loaded) is no
// sign of a wrong setup.
func (c *Checker) ControlPlaneSteady(d time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.realNow()
	n := len(c.op.planeDown)
	if n == 0 {
		return true
	}
	last := c.op.planeDown[n-1]
	return !last.to.IsZero() && !last.to.After(now.Add(-d))
}

// ObserveElection judges nothing: it follows the operator's
// leader-election Lease (watched or re-listed), whose terms are the
// stretches in which a leader could act while leader election was on.
func (c *Checker) ObserveElection(typ watch.EventType, l *coordinationv1.Lease) {
	c.mu.Lock()
	defer c.mu.Unlock()
	before := c.op.holder
	c.op.observeElection(typ, l)
	if c.op.holder != before {
		what := "election: no leader"
		if c.op.holder != "" {
			what = "election: " + c.op.holder + " leads from " + c.op.acquired.Format("15:04:05.000")
		}
		c.record(Entry{At: c.o.Now(), Kind: "Lease", Type: typ, Lock: LockKey{Namespace: l.Namespace}, Name: l.Name, UID: l.UID, RV: l.ResourceVersion, What: what})
	}
}

// allowance is how long, within [since, now), no manager could act, or the
// checker could not see what it did: what a reaction due since since may
// take longer than the hold slack.
func (c *Checker) allowance(since, now time.Time) time.Duration {
	return c.op.unseen(since, now)
}

// WatchDown tells the checker that its watch of kind (BuildLock, Lease)
// is not delivering: it ended, failed, or is being set up again (a
// re-list included). WatchUp says it is again.
func (c *Checker) WatchDown(kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.op.blindSince[kind]; !ok {
		c.op.blindSince[kind] = c.realNow()
	}
}

// WatchUp tells the checker that its watch of kind is back (see WatchDown).
func (c *Checker) WatchUp(kind string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	since, ok := c.op.blindSince[kind]
	if !ok {
		return
	}
	delete(c.op.blindSince, kind)
	now := c.realNow()
	if now.Sub(since) < minBlind {
		return
	}
	c.op.blind = append(c.op.blind, span{from: since, to: now, why: kind})
	c.record(Entry{At: c.o.Now(), Kind: "Run", What: fmt.Sprintf("the checker's %s watch was down for %s", kind, now.Sub(since).Round(time.Millisecond))})
}

// OutageFigures says, for the report, how long the operator could not act
// over the run and why, and how long the control plane was down.
func (c *Checker) OutageFigures() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.realNow()
	if !c.op.tracking {
		return "operator outages: not followed (the run reported no managers)"
	}
	var first time.Time
	if len(c.op.bare) > 0 {
		first = c.op.bare[0].from
	}
	spans := c.op.outages(first, now)
	var total, longest time.Duration
	why := ""
	for _, s := range spans {
		d := s.to.Sub(s.from)
		total += d
		if d > longest {
			longest, why = d, s.why
		}
	}
	var plane, blind, longestBlind time.Duration
	for _, s := range c.op.planeDown {
		plane += s.end(now).Sub(s.from)
	}
	for _, s := range c.op.blind {
		blind += s.to.Sub(s.from)
		longestBlind = max(longestBlind, s.to.Sub(s.from))
	}
	return fmt.Sprintf("operator outages (no manager could act: none running, or its API server or etcd down, or cut off, or no leader by the election Lease): %d, %s in total, longest %s (%s); "+
		"leader-election terms seen: %d (%d versions of %s); control plane (an API server or etcd) down: %d times, %s in total; "+
		"the checker's own watches (BuildLock, Lease) down for a second or more: %d times, %s in all, longest %s",
		len(spans), total.Round(time.Millisecond), longest.Round(time.Millisecond), why, len(c.op.terms), c.op.electionVersions, ElectionLease,
		len(c.op.planeDown), plane.Round(time.Millisecond), len(c.op.blind), blind.Round(time.Millisecond), longestBlind.Round(time.Millisecond))
}
