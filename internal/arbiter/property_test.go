package arbiter

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPropertiesOfRandomClaimSets(t *testing.T) {
	ch := seeded(1)
	for k := range 5000 {
		in := genInput(ch)
		d := in.decide()
		if err := checkInvariants(in, d); err != nil {
			t.Fatalf("input %d: %v\n%s", k, err, describeInput(in))
		}
		// A random shuffle, beyond the reorderings checkInvariants tries.
		shuffled := append([]Claim(nil), in.claims...)
		ch.r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if other := Decide(staging, shuffled, in.grant, in.now, in.policy); !reflect.DeepEqual(other, d) {
			t.Fatalf("input %d: order matters:\n%s\nversus\n%s", k, d, other)
		}
	}
}

// TestPropertiesOfFrozenTargets checks every invariant on random inputs
// with freezes and overrides (rule 12).
func TestPropertiesOfFrozenTargets(t *testing.T) {
	ch, freezes := seeded(1), seeded(12)
	for k := range 5000 {
		in := withFreezes(freezes, genInput(ch))
		if err := checkInvariants(in, in.decide()); err != nil {
			t.Fatalf("input %d: %v\n%s", k, err, describeInput(in))
		}
	}
}

// world is one lock over time: its claims and grant as the controller would
// read them after writing every decision, and the highest token the
// operator has seen (which it passes as the record's Floor).
type world struct {
	claims   []Claim
	grant    Grant
	now      time.Time
	policy   Policy
	arrivals int
	memory   int64
}

// happen applies one random event to the world and says what it was.
// Arrivals happen only while arriving is set; the grant record is lost (as
// if the Lease were deleted) or edited by hand only while hostile is set.
func (w *world) happen(ch chooser, arriving, hostile bool) string {
	for {
		switch ch.intn(13) {
		case 0, 1, 2:
			if arriving {
				return w.arrive(ch)
			}
		case 3, 4:
			if i, ok := w.pick(ch, func(c Claim) bool { return c.Pod == PodAlive || c.Pod == PodUnknown }); ok {
				w.claims[i].Pod = []PodState{PodFinished, PodGone}[ch.intn(2)]
				return fmt.Sprintf("the pod of %s is %s", w.claims[i].Name, w.claims[i].Pod)
			}
		case 5:
			if i, ok := w.pick(ch, func(c Claim) bool { return c.Pod == PodAlive || c.Pod == PodUnknown }); ok {
				w.claims[i].Pod = PodAlive + PodUnknown - w.claims[i].Pod
				return fmt.Sprintf("the pod of %s is %s", w.claims[i].Name, w.claims[i].Pod)
			}
		case 6:
			if i, ok := w.pick(ch, func(Claim) bool { return true }); ok {
				name := w.claims[i].Name
				w.claims = append(w.claims[:i], w.claims[i+1:]...)
				return "deleted " + name
			}
		case 7, 8:
			w.now = w.now.Add(time.Duration(1+ch.intn(40)) * time.Minute)
			return "time passes to " + w.now.Format(time.TimeOnly)
		case 9:
			if i, ok := w.pick(ch, func(c Claim) bool { return c.Pod == NoPod }); ok {
				// Some clients' clocks run far ahead: that must extend nothing.
				w.claims[i].RenewTime = w.now.Add(time.Duration(ch.intn(2)) * 1000 * time.Hour)
				return "renewed " + w.claims[i].Name + " at " + w.claims[i].RenewTime.Format(time.DateTime)
			}
		case 10:
			if hostile {
				w.grant = Grant{Absent: true}
				return "the grant record is deleted"
			}
		case 11, 12:
			if hostile {
				return w.edit(ch)
			}
		}
	}
}

// edit changes the grant record as a person with the rights to write it
// might: every edit but one that names another claim and raises the token
// too (which looks like a hand-off, see rule 11) is one the claims show to
// be wrong.
func (w *world) edit(ch chooser) string {
	switch ch.intn(5) {
	case 0:
		if i, ok := w.pick(ch, func(c Claim) bool { return c.Phase == Waiting || c.Phase == Pending }); ok {
			w.grant.Holder, w.grant.HolderUID = w.claims[i].Name, w.claims[i].UID
			return "the record is edited to name " + w.claims[i].Name
		}
	case 1:
		w.grant.Writer = Writer{PodUID: "pod-of-an-intruder"}
		return "the record's writer is edited"
	case 2:
		w.grant.Token = 0
		return "the record's token is edited to 0"
	case 3:
		w.grant.Holder, w.grant.HolderUID, w.grant.AcquiredAt = "", "", time.Time{}
		return "the record is edited to name nobody"
	}
	w.grant.Holder, w.grant.HolderUID = "ghost", "uid-ghost"
	return "the record is edited to name a claim that does not exist"
}

func (w *world) arrive(ch chooser) string {
	c := claim(fmt.Sprintf("c%03d", w.arrivals), genLines[ch.intn(len(genLines))], int64(1+ch.intn(8)), 0)
	w.arrivals++
	// Clients' clocks and start times vary: build start times lag creation,
	// and now and then a clock runs far ahead.
	c.Timestamp = w.now.Add(-time.Duration(ch.intn(10)) * time.Minute)
	if ch.intn(8) == 0 {
		c.Timestamp = w.now.Add(24 * time.Hour)
	}
	c.Created = w.now
	if ch.intn(4) == 0 {
		c.Pod, c.ExpiresAfter = NoPod, genExpiries[1+ch.intn(len(genExpiries)-1)]
	}
	c.Writer = Writer{PodUID: "pod-" + c.Name}
	c.Identity = genIdentities[ch.intn(len(genIdentities))]
	c.CIIdentity = genCIIdentity(c.Identity)
	// Second workflows of a line, and rollbacks (re-runs come by
	// themselves: build numbers repeat).
	if ch.intn(5) == 0 {
		c.Workflow = "hotfix.yml"
	}
	if ch.intn(6) == 0 {
		c.Rollback, c.RollbackReason = true, "INC-7"
	}
	// A CI identity's workflow, its token names (issue 31).
	c.WorkflowVerified = c.Workflow != "" && c.CIIdentity && ch.intn(2) == 0
	w.claims = append(w.claims, c)
	return fmt.Sprintf("%s arrives: build %d of %s/%s/%s (rollback %v, %q) stamped %s", c.Name, c.Build, c.Repo, c.Branch, c.Workflow,
		c.Rollback, c.Identity, c.Timestamp.Format(time.TimeOnly))
}

// pick returns a random claim that matches.
func (w *world) pick(ch chooser, match func(Claim) bool) (int, bool) {
	var matching []int
	for i, c := range w.claims {
		if match(c) {
			matching = append(matching, i)
		}
	}
	if len(matching) == 0 {
		return 0, false
	}
	return matching[ch.intn(len(matching))], true
}

// decide decides, checks every invariant, applies the decision and returns it.
func (w *world) decide(t *testing.T, history []string) Decision {
	t.Helper()
	w.grant.Floor = w.memory
	in := input{claims: w.claims, grant: w.grant, now: w.now, policy: w.policy}
	d := in.decide()
	if err := checkInvariants(in, d); err != nil {
		t.Fatalf("%v\nafter:\n  %s\n%s", err, strings.Join(history, "\n  "), describeInput(in))
	}
	w.claims, w.grant = d.Apply(w.claims), d.Grant
	w.memory = max(w.memory, w.grant.Token)
	for _, c := range w.claims {
		w.memory = max(w.memory, c.FencingToken)
	}
	return d
}

func TestPropertiesOfRandomEventSequences(t *testing.T) {
	for seed := range uint64(400) {
		hostile := seed%4 == 3
		t.Run(fmt.Sprintf("seed=%d,hostile=%v", seed, hostile), func(t *testing.T) {
			ch := seeded(seed)
			w := &world{now: t0, policy: Policy{MaxHold: genMaxHolds[ch.intn(len(genMaxHolds))], Ordering: genOrderings[seed%3]}}
			w.policy.RefuseReruns = seed%5 == 1
			w.policy.Rollbacks = genRollbacks[(seed/5)%4]
			var history []string
			var lastToken int64
			holder := ""
			terminal := map[string]Phase{}
			fair := newFairness()
			grants := newGrantLog()
			for range 60 {
				event := w.happen(ch, true, hostile)
				history = append(history, event)
				d := w.decide(t, history)
				if err := fair.observe(w, d); err != nil {
					t.Fatalf("%v\n%s", err, strings.Join(history, "\n"))
				}
				if err := grants.observe(w, d, holder); err != nil && !hostile {
					t.Fatalf("%v\n%s", err, strings.Join(history, "\n"))
				}
				if d.Holder != "" && d.Holder != holder {
					// Tokens strictly increase with each new hold, whatever
					// was deleted or edited: the operator's memory of the
					// highest token (the record's Floor) outlives the
					// record.
					if d.Grant.Token <= lastToken {
						t.Fatalf("granted token %d after %d\n%s", d.Grant.Token, lastToken, strings.Join(history, "\n"))
					}
					lastToken = d.Grant.Token
				}
				if strings.HasPrefix(event, "the record") && holder != "" && d.Holder != holder {
					t.Fatalf("%s held; after %q, %q holds\n%s", holder, event, d.Holder, strings.Join(history, "\n"))
				}
				if d.Holder != "" && d.Grant.Writer != writerOf(w.claims, d.Holder) {
					t.Fatalf("%s holds, but the record's writer is %+v\n%s", d.Holder, d.Grant.Writer, strings.Join(history, "\n"))
				}
				holder = d.Holder
				held := 0
				for _, c := range w.claims {
					if was, ok := terminal[c.Name]; ok && c.Phase != was {
						t.Fatalf("terminal %s became %s\n%s", c.Name, c.Phase, strings.Join(history, "\n"))
					}
					if c.Phase.IsTerminal() {
						terminal[c.Name] = c.Phase
					}
					if c.Phase == Held {
						held++
					}
				}
				if held > 1 {
					t.Fatalf("%d claims hold\n%s", held, strings.Join(history, "\n"))
				}
			}
			checkLiveness(t, ch, w, history)
		})
	}
}

// grantLog checks "never backwards" over a history of grants, restated
// without the arbiter's memory: every grant of a claim that is not a
// rollback is of a build above every build of its line granted since the
// line's last rollback (that rollback's included) within the line memory,
// or of the same build (a re-run) where the policy allows re-runs; and a
// rollback is granted only where the policy allows it from its identity.
// Only a grant record that nobody deleted or edited keeps that memory, so
// it holds in histories without hostile events.
type grantLog struct {
	lines map[line][]loggedGrant
	seq   int
}

type loggedGrant struct {
	build    int64
	at       time.Time
	rollback bool
	started  time.Time // the build's OrderTime
	seq      int       // the order of the grants
}

func newGrantLog() *grantLog { return &grantLog{lines: map[line][]loggedGrant{}} }

// remembered is line l's highest build granted since its last rollback
// (that rollback's included) within the line memory at now, if any, and
// the sequence number of that rollback (-1: none).
func (g *grantLog) remembered(l line, now time.Time) (best loggedGrant, ok bool, rolledBack int) {
	rolledBack = -1
	for _, e := range g.lines[l] {
		switch {
		case !now.Before(e.at.Add(DefaultGrantRetention)):
		case e.rollback:
			best, ok, rolledBack = e, true, e.seq
		case !ok || e.build >= best.build:
			best, ok = e, true
		}
	}
	return best, ok, rolledBack
}

// observe takes the next decision of w (already applied); before is the
// holder before it. Besides its line's builds, a grant respects its
// branch (issue 31): no build of another line of its branch granted since
// the branch's last rollback (each line's highest) started after it,
// unless it is a rollback; and a claim whose workflow nothing verified
// respects the builds of its branch's line without a workflow too.
func (g *grantLog) observe(w *world, d Decision, before string) error {
	if d.Holder == "" || d.Holder == before {
		return nil
	}
	i := slices.IndexFunc(w.claims, func(c Claim) bool { return c.Name == d.Holder })
	c := w.claims[i]
	l := lineOf(c)
	var highest int64 // since the last rollback, within the memory
	if e, ok, _ := g.remembered(l, w.now); ok {
		highest = e.build
	}
	var branchBuild int64
	if c.Workflow != "" && !c.WorkflowVerified {
		if e, ok, _ := g.remembered(lineOf(withoutWorkflow(c)), w.now); ok {
			branchBuild = e.build
		}
	}
	// The branch's last rollback, and each of its other lines' record.
	branchRollback := -1
	var others []loggedGrant
	for other := range g.lines {
		if other.repo != c.Repo || other.branch != c.Branch {
			continue
		}
		e, ok, rolledBack := g.remembered(other, w.now)
		branchRollback = max(branchRollback, rolledBack)
		if ok && other != l {
			others = append(others, e)
		}
	}
	g.seq++
	g.lines[l] = append(g.lines[l], loggedGrant{build: c.Build, at: w.now, rollback: c.Rollback, started: w.policy.OrderTime(c), seq: g.seq})
	switch {
	case c.Rollback && !mayRollBack(w.policy, c):
		return fmt.Errorf("%s, a rollback by %q, granted under rollbacks %q", c.Name, c.Identity, w.policy.Rollbacks)
	case c.Rollback:
	case c.Build < highest:
		return fmt.Errorf("%s: build %d granted after build %d of its line", c.Name, c.Build, highest)
	case c.Build == highest && w.policy.RefuseReruns:
		return fmt.Errorf("%s: a re-run of build %d granted, though the policy refuses re-runs", c.Name, c.Build)
	case c.Build < branchBuild || c.Build == branchBuild && w.policy.RefuseReruns:
		return fmt.Errorf("%s: build %d of a workflow nothing verified granted after build %d of its branch", c.Name, c.Build, branchBuild)
	}
	for _, e := range others {
		if !c.Rollback && e.seq >= branchRollback && e.started.After(w.policy.OrderTime(c)) {
			return fmt.Errorf("%s: started at %s, granted after build %d of its branch, which started at %s", c.Name,
				w.policy.OrderTime(c).Format(time.TimeOnly), e.build, e.started.Format(time.TimeOnly))
		}
	}
	return nil
}

// writerOf is the Writer of the claim named name.
func writerOf(claims []Claim, name string) Writer {
	for _, c := range claims {
		if c.Name == name {
			return c.Writer
		}
	}
	return Writer{}
}

// fairness checks the bound of the Queue ordering over a sequence of
// decisions: a line that joins the queue with k other lines ahead of it holds
// after at most k+1 hand-offs.
type fairness struct {
	handOffs int
	holder   string
	joined   map[line]joinedLine
}

type joinedLine struct {
	ahead    int // lines queued ahead of it when it joined
	handOffs int // hand-offs before it joined
}

func newFairness() *fairness { return &fairness{joined: map[line]joinedLine{}} }

// observe takes the next decision of w (already applied).
func (f *fairness) observe(w *world, d Decision) error {
	if w.policy.Ordering != Queue {
		return nil
	}
	claims := map[string]Claim{}
	for _, c := range w.claims {
		claims[c.Name] = c
	}
	if d.Holder != "" && d.Holder != f.holder {
		f.handOffs++
		l := lineOf(claims[d.Holder])
		if j, ok := f.joined[l]; ok {
			if waited := f.handOffs - j.handOffs; waited > j.ahead+1 {
				return fmt.Errorf("%s@%s held after %d hand-offs, with %d lines ahead when it joined", l.repo, l.branch, waited, j.ahead)
			}
			delete(f.joined, l)
		}
	}
	f.holder = d.Holder
	queued := map[line]time.Time{}
	for _, v := range d.Verdicts {
		if v.Phase == Waiting {
			queued[lineOf(claims[v.Name])] = v.QueuedAt
		}
	}
	for l := range f.joined {
		if _, ok := queued[l]; !ok {
			delete(f.joined, l) // it left the queue
		}
	}
	for l, place := range queued {
		if _, ok := f.joined[l]; ok {
			continue
		}
		ahead := 0
		for other, p := range queued {
			if other != l && p.Before(place) {
				ahead++
			}
		}
		f.joined[l] = joinedLine{ahead: ahead, handOffs: f.handOffs}
	}
	return nil
}

// checkLiveness stops arrivals and ends holders one by one: each time, the
// claim that waited (the newest survivor) holds next, and the lock ends up
// free with every claim terminal.
func checkLiveness(t *testing.T, ch chooser, w *world, history []string) {
	t.Helper()
	history = append(history, "arrivals stop")
	d := w.decide(t, history)
	for range len(w.claims) + 1 {
		if d.Holder == "" {
			for _, c := range w.claims {
				if !c.Phase.IsTerminal() {
					t.Fatalf("lock free but %s is %s\n%s", c.Name, c.Phase, strings.Join(history, "\n"))
				}
			}
			return
		}
		next := d.Waiting
		i, _ := w.pick(ch, func(c Claim) bool { return c.Name == d.Holder })
		switch holder := w.claims[i]; {
		case (holder.Pod == NoPod || w.policy.MaxHold > 0) && ch.intn(2) == 0:
			w.now, _ = holdDeadline(&holder, w.grant.AcquiredAt, w.now, w.policy.MaxHold)
			history = append(history, "the hold of "+holder.Name+" expires")
		case ch.intn(2) == 0:
			w.claims = append(w.claims[:i], w.claims[i+1:]...)
			history = append(history, "deleted "+holder.Name)
		default:
			w.claims[i].Pod = PodFinished
			history = append(history, "the pod of "+holder.Name+" finished")
		}
		d = w.decide(t, history)
		if d.Holder != next {
			t.Fatalf("after the holder ended, %q holds, but %q waited\n%s", d.Holder, next, strings.Join(history, "\n"))
		}
	}
	t.Fatalf("the lock was never freed\n%s", strings.Join(history, "\n"))
}

// describeInput prints an input for failure messages.
func describeInput(in input) string {
	var b strings.Builder
	fmt.Fprintf(&b, "now=%s policy=%v grant={%s}", in.now.Format(time.TimeOnly), in.policy, in.grant)
	for _, c := range in.claims {
		fmt.Fprintf(&b, "\n  %s/%s %s/%s/%s#%d rollback=%v stamp=%s created=%s phase=%q token=%d pod=%s expiresAfter=%s renew=%s renewed=%s queued=%s acquired=%s identity=%q override=%q until %s",
			c.Name, c.UID, c.Repo, c.Branch, c.Workflow, c.Build, c.Rollback, c.Timestamp.Format(time.TimeOnly), c.Created.Format(time.TimeOnly),
			c.Phase, c.FencingToken, c.Pod, c.ExpiresAfter, c.RenewTime.Format(time.TimeOnly), c.RenewedAt.Format(time.TimeOnly),
			c.QueuedAt.Format(time.TimeOnly), c.AcquiredAt.Format(time.TimeOnly), c.Identity, c.Override.Reason, c.Override.Expires.Format(time.TimeOnly))
	}
	return b.String()
}
