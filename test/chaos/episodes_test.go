package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// episode is one kind of fault in the schedule.
type episode struct {
	name   string
	weight int
	run    func(context.Context)
}

// chaos runs the workload and the fault schedule for the run's duration. The
// schedule is a seeded sequence of episodes, each a few seconds long:
//
//   - restart: kill a healthy manager (no graceful release) and start another;
//   - split brain: start a second manager, let both run 2–6 s, kill one;
//   - zombie: start a manager, freeze it 3–6 s in the middle of its work
//     while the others move on, thaw it so that it writes what it decided
//     before, then kill it;
//   - warp: time jumps 2–6 s forward for everybody (pod-less holds expire);
//   - calm: nothing for 1–3 s;
//   - API server killed: SIGKILL one of the two API servers, restart it on
//     the same etcd (its watch cache starts afresh: watches resuming there
//     get 410 Gone);
//   - etcd killed: SIGKILL etcd and restart it on its data directory;
//   - compaction: compact etcd up to its current revision (watches resuming
//     from before it fail with 410 Gone and re-list);
//   - partition: a manager's traffic to its API server becomes slow
//     (0.2–2 s more per exchange) or stops (blackhole), then heals, resuming
//     what was held back or resetting the connections;
//   - partition under leader election: the elected manager is partitioned,
//     another is elected, and the first heals still acting on what it had.
//
// Every manager's clock is skewed by up to ±maxSkew, and a fraction of its
// writes and live reads fail (see faultPlan). Managers are spread over the
// two API servers. The actors (the people, the CI jobs) run alongside the
// workload, and stop with it.
func (h *harness) chaos(ctx context.Context, actors ...func(context.Context)) {
	rng := rand.New(rand.NewPCG(h.o.seed, 0x7363686564756c65))
	skew := func() time.Duration {
		return time.Duration(rng.Int64N(int64(2*h.o.maxSkew))) - h.o.maxSkew
	}
	h.faults.plan.on.Store(true)
	h.startManager(ctx, skew(), "")

	wctx, stopWorkload := context.WithCancel(ctx)
	work := newWorkload(h.c, h.o.seed, h.clock, h.ledger, h.check, h.targets)
	work.retention = h.o.retention
	work.switchEvery = max(h.o.duration/6, 10*time.Second)
	for k, o := range h.switching {
		work.policies[k], work.policyChange[k] = o, time.Now()
	}
	workDone := make(chan struct{})
	go func() { defer close(workDone); work.run(wctx) }()
	var actorsDone sync.WaitGroup
	for _, run := range actors {
		actorsDone.Go(func() { run(wctx) })
	}
	// The load run starts once the episodes are under way; its pipelines
	// live on their own timeouts, not the workload's.
	load, loadDone := h.prepareLoad(ctx), make(chan struct{})
	go func() {
		defer close(loadDone)
		if load == nil {
			return
		}
		select {
		case <-time.After(min(h.o.duration/4, time.Minute)):
			h.runLoad(ctx, load)
		case <-wctx.Done():
		}
	}()

	deadline := time.Now().Add(h.o.duration)
	sleep := func(lo, hi time.Duration) {
		d := lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
		time.Sleep(d)
	}
	// Episodes in the short run are shorter, so that it has them all.
	scale := func(d time.Duration) time.Duration {
		if h.o.long {
			return d
		}
		return d / 2
	}
	episodes, episodeTime := newCounters(), newCounters()
	kinds := []episode{
		{"restart", 25, func(ctx context.Context) {
			healthy := h.healthy()
			h.kill(healthy[rng.IntN(len(healthy))])
			h.startManager(ctx, skew(), "")
		}},
		{"split brain", 14, func(ctx context.Context) {
			h.startManager(ctx, skew(), "")
			sleep(scale(2*time.Second), scale(6*time.Second))
			healthy := h.healthy()
			h.kill(healthy[rng.IntN(len(healthy))])
		}},
		{"zombie frozen at " + freezeAtDecide, 5, func(ctx context.Context) { h.zombie(ctx, skew(), freezeAtDecide, sleep, scale) }},
		{"zombie frozen at " + freezeAtWrite, 5, func(ctx context.Context) { h.zombie(ctx, skew(), freezeAtWrite, sleep, scale) }},
		{"clock warp", 8, func(context.Context) {
			d := 2*time.Second + time.Duration(rng.Int64N(int64(4*time.Second)))
			h.clock.advance(d)
			h.mu.Lock()
			h.warps++
			h.warpTotal += d
			h.mu.Unlock()
		}},
	}
	if h.o.controlPlane {
		kinds = append(kinds,
			episode{"API server killed", 6, func(context.Context) { h.killAPIServer(rng.IntN(len(h.cp.apiservers)), sleep) }},
			episode{"etcd killed", 3, func(context.Context) { h.killEtcd(sleep) }},
			episode{"compaction", 6, func(ctx context.Context) { h.compact(ctx, sleep) }},
			episode{"partition (slow)", 4, func(ctx context.Context) { h.partition(ctx, rng, skew(), false, false, sleep, scale) }},
			episode{"partition (blackhole)", 4, func(ctx context.Context) { h.partition(ctx, rng, skew(), true, false, sleep, scale) }},
			episode{"partition of the leader", 4, func(ctx context.Context) { h.partition(ctx, rng, skew(), rng.IntN(3) > 0, true, sleep, scale) }},
		)
	}
	// Every kind of fault comes once first so that even the short run has
	// them all: the instant ones (a clock warp, a restart), then the others
	// in a seeded order; then they are drawn at random by weight, calm
	// included.
	first := make([]int, len(kinds))
	for i := range first {
		first[i] = i
	}
	first[0], first[4] = first[4], first[0] // the warp first, then the restart
	first[1], first[4] = first[4], first[1]
	rng.Shuffle(len(first)-2, func(i, j int) { first[2+i], first[2+j] = first[2+j], first[2+i] })
	kinds = append(kinds, episode{"calm", 12, func(context.Context) { sleep(time.Second, 3*time.Second) }})
	for i := 0; i < len(first) || time.Now().Before(deadline); i++ {
		var k episode
		if i < len(first) {
			k = kinds[first[i]]
		} else {
			k = pick(rng, kinds, func(e episode) int { return e.weight })
		}
		episodes.add(k.name, 1)
		began := time.Now()
		h.episodes.Lock()
		k.run(ctx)
		h.episodes.Unlock()
		episodeTime.add(k.name, int(time.Since(began).Milliseconds()))
		sleep(scale(300*time.Millisecond), scale(1500*time.Millisecond))
	}

	// The workload ends with a burst that ends the holders of half the
	// targets while the faults still run, so that the last event of those
	// locks is a hand-off made under faults: the liveness check then sees
	// whether any got lost. The other half keep holder and waiter for the
	// drain.
	stopWorkload()
	<-workDone
	actorsDone.Wait()
	<-loadDone
	burstTargets := map[LockKey]bool{}
	for i, k := range h.targets {
		if i%2 == 0 {
			burstTargets[k] = true
		}
	}
	burst := work.endHolders(ctx, burstTargets)
	time.Sleep(2 * time.Second)

	// Faults end: no more injected errors, no zombie, one manager left.
	h.faults.plan.on.Store(false)
	healthy := h.healthy()
	h.mu.Lock()
	running := append([]*managerCtl(nil), h.running...)
	h.mu.Unlock()
	for _, m := range running {
		if m.zombie != nil {
			m.zombie.unfreeze()
		}
		if m != healthy[len(healthy)-1] {
			h.kill(m)
		}
	}

	h.mu.Lock()
	h.figure0("workload: %d operations in %s: %s; final burst under faults: %d holders ended", work.ops.total(), h.o.duration, work.ops, burst)
	h.figure0("workload operations the API server refused or that failed (expected: deleting what the TTL deleted, calls while an API server or etcd was down, and so on): %s", work.failed)
	h.figure0("fault schedule: %s; time in each kind (ms): %s", episodes, episodeTime)
	h.figure0("managers: %d started, %d killed without release (%d of them zombies); split brain (2+ managers running) %.1fs; clock warps %d (+%s); skews within ±%s",
		h.started, h.killed, h.zombies, h.split.Seconds(), h.warps, h.warpTotal, h.o.maxSkew)
	h.mu.Unlock()
}

// figure0 is figure with h.mu held.
func (h *harness) figure0(format string, args ...any) {
	h.figures = append(h.figures, fmt.Sprintf(format, args...))
}

// zombie starts a manager, freezes it at point while the others move on,
// thaws it so that it writes what it read or decided before, then kills it.
func (h *harness) zombie(ctx context.Context, skew time.Duration, point string, sleep func(lo, hi time.Duration), scale func(time.Duration) time.Duration) {
	z := h.startManager(ctx, skew, point)
	sleep(scale(500*time.Millisecond), scale(1500*time.Millisecond))
	z.zombie.freeze()
	h.check.ManagerCut(z.name(), true)
	sleep(scale(3*time.Second), scale(6*time.Second))
	z.zombie.unfreeze()
	h.check.ManagerCut(z.name(), false)
	sleep(scale(500*time.Millisecond), scale(time.Second))
	h.kill(z)
}

// killAPIServer SIGKILLs API server i and starts it again on the same etcd
// and port. The managers on it lose their connections and, with the new
// watch cache, their watches' resourceVersions: they re-list.
func (h *harness) killAPIServer(i int, sleep func(lo, hi time.Duration)) {
	p := h.cp.apiservers[i]
	h.check.APIServerDown(p.name)
	p.kill()
	h.plane.add(fmt.Sprintf("%s killed", p.name), 1)
	sleep(300*time.Millisecond, 1500*time.Millisecond)
	began := time.Now()
	for attempt := 0; ; attempt++ {
		err := p.start(2 * time.Minute)
		if err == nil {
			break
		}
		if attempt == 2 {
			h.t.Fatalf("restarting %s: %v", p.name, err)
		}
		h.t.Logf("restarting %s: %v; again", p.name, err)
	}
	h.check.APIServerUp(p.name)
	h.plane.add("API server restart time (ms)", int(time.Since(began).Milliseconds()))
}

// killEtcd SIGKILLs etcd and starts it again on its data directory.
func (h *harness) killEtcd(sleep func(lo, hi time.Duration)) {
	h.check.EtcdDown()
	h.cp.etcd.kill()
	h.plane.add("etcd killed", 1)
	sleep(200*time.Millisecond, time.Second)
	if err := h.cp.etcd.start(time.Minute); err != nil {
		h.t.Fatalf("restarting etcd: %v", err)
	}
	h.check.EtcdUp()
}

// compact compacts etcd up to its current revision while the clients of the
// API server that serves watches from etcd (B: the managers on it, and the
// checker) are cut off for 1–2 s, as by a network blip: their watches then
// resume from before the compaction, fail with 410 Gone, and list again.
// (The API server with a watch cache would serve them from its cache.)
func (h *harness) compact(ctx context.Context, sleep func(lo, hi time.Duration)) {
	const server = 1
	h.mu.Lock()
	var cut []*managerCtl
	for _, m := range h.running {
		if m.server == server && !m.partitioned.Load() {
			cut = append(cut, m)
		}
	}
	h.mu.Unlock()
	for _, m := range cut {
		h.check.ManagerCut(m.name(), true)
		m.proxy.blackhole()
	}
	h.cutChecker()
	sleep(time.Second, 2*time.Second)
	if _, err := h.cp.compact(ctx); err != nil {
		h.plane.add("compaction failed", 1)
		h.t.Logf("compacting etcd: %v", err)
	} else {
		h.plane.add("etcd compactions", 1)
	}
	for _, m := range cut {
		m.proxy.heal(true)
		h.check.ManagerCut(m.name(), false)
	}
	h.healChecker(server)
	h.plane.add("managers cut off during a compaction", len(cut))
}

// partition starts a manager behind a partition proxy and partitions it:
// blackhole (nothing flows) or slow (0.2–2 s added to every exchange), for
// 2–6 s, then heals it, resuming what was held back or resetting its
// connections, and kills it a little later.
//
// Under leader election, the deciding managers are elected ones for the
// episode: the others are killed, the proxied manager is elected first, a
// second one stands by on the other API server; the partition outlasts the
// election lease, so the second takes over while the first may still
// believe it leads, holding writes it computed before.
func (h *harness) partition(ctx context.Context, rng *rand.Rand, skew time.Duration, blackhole, leaderElection bool,
	sleep func(lo, hi time.Duration), scale func(time.Duration) time.Duration) {
	server := rng.IntN(len(h.cp.apiservers))
	kind := "slow"
	if blackhole {
		kind = "blackhole"
	}
	var standby *managerCtl
	if leaderElection {
		kind = "leader " + kind
		for _, m := range h.healthy() {
			h.kill(m)
		}
	}
	m := h.startManagerWith(ctx, managerSpec{skew: skew, server: server, episode: true, leaderElection: leaderElection})
	if leaderElection {
		select {
		case <-m.elected:
		case <-time.After(15 * time.Second):
			h.faults.partition.add("leader not elected within 15s", 1)
		}
		standby = h.startManagerWith(ctx, managerSpec{skew: -skew, server: 1 - server, episode: true, leaderElection: true})
	}
	sleep(scale(500*time.Millisecond), scale(1500*time.Millisecond))
	m.partitioned.Store(true)
	if blackhole {
		h.check.ManagerCut(m.name(), true)
		m.proxy.blackhole()
	} else {
		m.proxy.slow(200*time.Millisecond + time.Duration(rng.Int64N(int64(1800*time.Millisecond))))
	}
	h.faults.partition.add(kind, 1)
	hold := scale(2*time.Second) + time.Duration(rng.Int64N(int64(scale(4*time.Second))))
	if leaderElection {
		hold = 5*time.Second + time.Duration(rng.Int64N(int64(2*time.Second))) // beyond the 4 s election lease
	}
	time.Sleep(hold)
	if standby != nil {
		select {
		case <-standby.elected:
			h.faults.partition.add("standby elected during the partition", 1)
		default:
		}
	}
	reset := rng.IntN(2) == 0
	m.proxy.heal(reset)
	m.partitioned.Store(false)
	h.check.ManagerCut(m.name(), false)
	if reset {
		h.faults.partition.add("healed by resetting connections", 1)
	} else {
		h.faults.partition.add("healed by resuming connections", 1)
	}
	sleep(scale(time.Second), scale(2*time.Second))
	h.kill(m)
	if leaderElection {
		h.kill(standby)
		h.startManager(ctx, skew, "")
	}
}
