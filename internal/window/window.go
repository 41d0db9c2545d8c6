// Package window decides, for one deploy target's windows, whether the
// target is open or frozen at an instant, which windows are in effect, and
// when that changes next.
//
// [Compile] checks and prepares a policy's windows once; [Calendar.At] is
// then a pure function of the instant: it reads no clock, keeps no state
// and does no I/O, so that the controller can ask it about now, and tests
// about any instant. [FromPolicy] reads a BuildLockPolicy's spec.windows
// for Compile, and [PolicyStatus] writes a State as the policy's status.
//
// # Rules
//
//  1. Deny beats Allow. The target is frozen while any Deny window is in
//     effect; otherwise, if the calendar has any Allow window, it is open
//     only while one of them is in effect; without Allow windows it is open.
//  2. A window is in effect from its start, inclusive, to its end,
//     exclusive: a one-off window on [Start, End); a recurring window in
//     an occurrence from every instant at which its schedule fires until
//     the clocks of its time zone show that start plus Duration (rule 3).
//     Occurrences that overlap or touch are in effect without a break.
//  3. Times are read on the clocks of the window's time zone. A schedule
//     fires at every instant at which they show a time it names: when the
//     clocks go back (fall back), the times they show twice fire twice;
//     when they skip forward (spring forward), a schedule that names a
//     skipped time fires once, at the skip, so that daylight saving never
//     loses a window. An occurrence ends when the clocks first show its
//     start plus Duration, or skip past it: a window from Friday 18:00 for
//     62h ends on Monday at 08:00 also on the weekends the clocks change
//     (after 61 or 63 hours), and a nightly one from 22:00 for 8h at 06:00.
//  4. A calendar with a window it cannot evaluate (an invalid schedule or
//     duration, an unknown time zone, a schedule that never fires, an end
//     not after its start) is frozen, and never changes: it fails closed
//     until the policy is fixed. [Compile] returns the errors naming each
//     such window.
//
// # The look-ahead
//
// [Calendar.At] looks for the next change up to [Horizon] ahead, and
// computes at most [Budget] schedule firings doing so (a schedule that
// fires every minute of a year would otherwise take half a million). When
// it finds none, State.Changes is false and State.Next is where the search
// stopped: the state is certain to hold until then, and the caller asks
// again at that instant.
package window

import (
	"cmp"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/robfig/cron/v3"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// Horizon is how far ahead [Calendar.At] looks for the next change: a year
// and a day, so that the next start of every window of a yearly schedule
// (24 December, say) is found.
const Horizon = 367 * 24 * time.Hour

// Budget is how many schedule firings [Calendar.At] computes at most.
const Budget = 20000

// Kind is what a window does while it is in effect.
type Kind uint8

const (
	// Deny freezes the target.
	Deny Kind = iota + 1
	// Allow opens it.
	Allow
)

func (k Kind) String() string {
	switch k {
	case Deny:
		return "Deny"
	case Allow:
		return "Allow"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Window is one window, as a policy states it: recurring (Schedule and
// Duration) or one-off (Start and End).
type Window struct {
	Kind Kind
	// Schedule is a five-field cron expression, read in TimeZone.
	Schedule string
	// Duration is how long each occurrence of a recurring window lasts.
	Duration time.Duration
	// Start and End bound a one-off window: [Start, End).
	Start, End time.Time
	// TimeZone is an IANA name; "" means UTC.
	TimeZone string
}

// Error is why a window cannot be evaluated.
type Error struct {
	// Window is the window's index in the windows given to Compile.
	Window int
	Err    error
}

func (e *Error) Error() string { return fmt.Sprintf("window %d: %v", e.Window, e.Err) }

func (e *Error) Unwrap() error { return e.Err }

// Calendar is a target's windows, checked and prepared. Its zero value, and
// a Calendar of no windows, is always open.
type Calendar struct {
	windows []compiled
	// allows reports whether any window is an Allow window.
	allows bool
	// invalid reports whether a window could not be compiled: the calendar
	// is frozen for good.
	invalid bool
}

// compiled is one window, prepared.
type compiled struct {
	kind     Kind
	loc      *time.Location
	schedule *cron.SpecSchedule // nil for a one-off window
	duration time.Duration
	start    time.Time // one-off only
	end      time.Time
}

// Active is a window in effect.
type Active struct {
	// Window is the window's index in the windows given to Compile.
	Window int
	Kind   Kind
	// Start is when the window's occurrence in effect started: for a
	// recurring window whose occurrences overlap, the earliest of those in
	// effect.
	Start time.Time
	// End is when it stops being in effect, the zero time when that is
	// after the end of the search (State.Next, when State.Changes is
	// false).
	End time.Time
}

// State is what a Calendar says about an instant.
type State struct {
	// Open reports whether the target takes grants.
	Open bool
	// Active are the windows in effect: Deny windows first, then Allow
	// windows; within a kind the longest-lasting first, then by index.
	Active []Active
	// Next is the first instant after the one asked about at which Open may
	// change: when Changes, Open changes there (right before Next it is as
	// now, from Next on it is the opposite); when not, the search ended
	// there without finding a change, and Open holds at least until then.
	Next time.Time
	// Changes reports whether Open changes at Next.
	Changes bool
}

// parser reads the five fields of the API's schedules (no seconds, no
// descriptors).
var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow)

// schedulePatterns are the API's patterns of a whole schedule, one per
// field, as the CRD checks them; the first is the shape.
var schedulePatterns = func() []*regexp.Regexp {
	res := []*regexp.Regexp{regexp.MustCompile(buildlockv1.ScheduleShapePattern)}
	for i, f := range buildlockv1.CronFieldPatterns {
		fields := []string{`\S+`, `\S+`, `\S+`, `\S+`, `\S+`}
		fields[i] = f.Pattern
		res = append(res, regexp.MustCompile("^"+strings.Join(fields, " +")+"$"))
	}
	return res
}()

var timeZonePattern = regexp.MustCompile(buildlockv1.TimeZonePattern)

// Compile checks and prepares windows. It returns a Calendar even when some
// window is invalid: that calendar is frozen for good (rule 4), and the
// error joins an *Error for each invalid window.
func Compile(windows []Window) (*Calendar, error) {
	c := &Calendar{windows: make([]compiled, 0, len(windows))}
	var errs []error
	for i, w := range windows {
		cw, err := compile(w)
		if err != nil {
			errs = append(errs, &Error{Window: i, Err: err})
			c.invalid = true
		}
		c.allows = c.allows || w.Kind == Allow
		c.windows = append(c.windows, cw)
	}
	return c, errors.Join(errs...)
}

// compile checks and prepares one window, as the API server checks it (and
// what it cannot check: that the zone is in this binary's database and
// that the schedule ever fires).
func compile(w Window) (compiled, error) {
	c := compiled{kind: w.Kind, duration: w.Duration, start: w.Start, end: w.End}
	if w.Kind != Deny && w.Kind != Allow {
		return c, fmt.Errorf("kind %v is neither Deny nor Allow", w.Kind)
	}
	loc, err := location(w.TimeZone)
	if err != nil {
		return c, err
	}
	c.loc = loc
	recurring := w.Schedule != "" || w.Duration != 0
	oneOff := !w.Start.IsZero() || !w.End.IsZero()
	switch {
	case recurring == oneOff:
		return c, errors.New("a window is either recurring (schedule and duration) or one-off (start and end): set exactly one of the two pairs")
	case oneOff:
		if w.Start.IsZero() || w.End.IsZero() {
			return c, errors.New("a one-off window needs both start and end")
		}
		if !w.End.After(w.Start) {
			return c, fmt.Errorf("its end %s is not after its start %s", w.End.Format(time.RFC3339), w.Start.Format(time.RFC3339))
		}
		return c, nil
	}
	if w.Duration < buildlockv1.MinWindowDuration || w.Duration > buildlockv1.MaxWindowDuration {
		return c, fmt.Errorf("its duration %s is not between %s and %s", w.Duration, buildlockv1.MinWindowDuration, buildlockv1.MaxWindowDuration)
	}
	c.schedule, err = parseSchedule(w.Schedule)
	return c, err
}

// location loads an IANA time zone, "" being UTC.
func location(name string) (*time.Location, error) {
	if name == "" {
		return time.UTC, nil
	}
	if !timeZonePattern.MatchString(name) || name == "Local" || strings.HasPrefix(name, "posix/") || strings.HasPrefix(name, "right/") {
		return nil, fmt.Errorf("time zone %q is not an IANA time-zone name such as Europe/Berlin", name)
	}
	if loc, ok := locations.Load(name); ok {
		return loc.(*time.Location), nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("time zone %q is not in the operator's time-zone database: %w", name, err)
	}
	locations.Store(name, loc)
	return loc, nil
}

// locations holds the zones loaded so far, by name: time.LoadLocation reads
// and parses the zone's file on every call, and the controller compiles a
// policy's windows on every decision of its lock. A binary's zone database
// does not change while it runs; the names are those the API server's own
// database knows, so the map stays small.
var locations sync.Map

// parseSchedule parses a five-field schedule that the API's patterns
// admit, to be evaluated on wall-clock times written as UTC (rule 3 is
// applied around it, see nextFire).
func parseSchedule(s string) (*cron.SpecSchedule, error) {
	if len(s) > buildlockv1.MaxScheduleLength {
		return nil, fmt.Errorf("schedule %q is longer than %d characters", s, buildlockv1.MaxScheduleLength)
	}
	if !schedulePatterns[0].MatchString(s) {
		return nil, fmt.Errorf("schedule %q is not five fields separated by spaces (minute hour day-of-month month day-of-week)", s)
	}
	for i, re := range schedulePatterns[1:] {
		if !re.MatchString(s) {
			return nil, fmt.Errorf("the %s field of schedule %q is not a cron field", buildlockv1.CronFieldPatterns[i].Name, s)
		}
	}
	parsed, err := parser.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("schedule %q: %w", s, err)
	}
	spec, ok := parsed.(*cron.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("schedule %q is not a cron expression", s)
	}
	spec.Location = time.UTC
	// Vixie cron's day rule: when both day fields are restricted, a day
	// matching either is enough; but a field whose text starts with '*'
	// (*/2, *,10) counts as unrestricted, so that both must match: "0 0 */2
	// * MON" fires on the odd days that are Mondays (cronie does the same).
	// robfig's parser decides by the parts of the list instead (a '*'
	// without a step anywhere in it); its dayMatches reads the star bit
	// set here.
	fields := strings.Fields(s)
	spec.Dom, spec.Dow = vixieStar(spec.Dom, fields[2]), vixieStar(spec.Dow, fields[4])
	// A five-field schedule repeats at the latest every eight years (29
	// February, across a century year that is not a leap year); robfig's
	// Next looks five years ahead, so two looks cover it.
	if spec.Next(neverFiresFrom).IsZero() && spec.Next(neverFiresFrom.AddDate(5, 0, 0)).IsZero() {
		return nil, fmt.Errorf("schedule %q never fires: no date has the day of month and month it names", s)
	}
	return spec, nil
}

// starBit marks a day field of a cron.SpecSchedule as unrestricted for the
// day rule (robfig/cron's own, unexported, value).
const starBit = 1 << 63

// vixieStar returns the bits of a day field whose text is field, marked
// unrestricted exactly when the text starts with '*'.
func vixieStar(bits uint64, field string) uint64 {
	if strings.HasPrefix(field, "*") {
		return bits | starBit
	}
	return bits &^ starBit
}

// neverFiresFrom is where parseSchedule looks whether a schedule fires.
var neverFiresFrom = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// Location is the time zone of window i, in which messages give its times;
// UTC for an index out of range or an invalid zone.
func (c *Calendar) Location(i int) *time.Location {
	if c == nil || i < 0 || i >= len(c.windows) || c.windows[i].loc == nil {
		return time.UTC
	}
	return c.windows[i].loc
}

// At is the state of the target at instant t.
func (c *Calendar) At(t time.Time) State {
	limit := t.Add(Horizon)
	if c == nil || len(c.windows) == 0 {
		return State{Open: true, Next: limit}
	}
	if c.invalid {
		return State{Open: false, Next: limit}
	}
	s := sweep{limit: limit, budget: Budget}
	cursors := make([]cursor, len(c.windows))
	for i := range c.windows {
		cursors[i] = cursor{w: &c.windows[i], after: t}
		cursors[i].advance(&s)
	}
	state := State{Open: c.open(cursors, t)}
	for i, cur := range cursors {
		if cur.activeAt(t) {
			a := Active{Window: i, Kind: cur.w.kind, Start: cur.p.start}
			if !cur.p.unbounded {
				a.End = cur.p.end
			}
			state.Active = append(state.Active, a)
		}
	}
	state.Next, state.Changes = c.search(cursors, t, state.Open, &s)
	// An end at or past where a search that found no change stopped is
	// past what it looked at.
	for i := range state.Active {
		if !state.Active[i].End.IsZero() && !state.Active[i].End.Before(state.Next) && !state.Changes {
			state.Active[i].End = time.Time{}
		}
	}
	slices.SortFunc(state.Active, byKindAndEnd)
	return state
}

// search jumps from t, where the state is open or not, from one instant
// at which it may change (candidate) to the next, moving on the windows
// that ended by then, until it does: it returns that instant and true,
// or where it stopped (the limit, or where the budget ran out) and false.
func (c *Calendar) search(cursors []cursor, t time.Time, open bool, s *sweep) (time.Time, bool) {
	for now := t; ; {
		next, ok := c.candidate(cursors, now, open)
		switch {
		case !ok || !next.Before(s.limit):
			return s.limit, false
		case s.budget <= 0:
			return next, false // out of work: the state is known up to here
		}
		for i := range cursors {
			if p := cursors[i].p; !p.none && !p.unbounded && !p.end.After(next) {
				cursors[i].after = next
				cursors[i].advance(s)
			}
		}
		switch {
		case !next.Before(s.limit): // the budget ran out before next
			return s.limit, false
		case c.open(cursors, next) != open:
			return next, true
		}
		now = next
	}
}

// byKindAndEnd orders State.Active: Deny windows first, then the
// longest-lasting (an unknown end last longest), then by index.
func byKindAndEnd(a, b Active) int {
	if a.Kind != b.Kind {
		return cmp.Compare(a.Kind, b.Kind) // Deny < Allow
	}
	if a.End.IsZero() != b.End.IsZero() {
		if a.End.IsZero() {
			return -1
		}
		return 1
	}
	if byEnd := b.End.Compare(a.End); byEnd != 0 {
		return byEnd
	}
	return cmp.Compare(a.Window, b.Window)
}

// candidate is the first instant after now at which the state, open at
// now or not, may change, for cursors positioned at now; false when there
// is none. Until then the state is certain to hold:
//   - frozen with Deny windows in effect, until the last of them ends;
//   - frozen outside every Allow window, until one starts;
//   - open, until a Deny window starts or, with Allow windows, until the
//     last of those in effect ends.
//
// An unbounded period's end is where the search stops knowing, at or
// after the search's limit.
func (c *Calendar) candidate(cursors []cursor, now time.Time, open bool) (time.Time, bool) {
	var first time.Time
	found := false
	consider := func(u time.Time) {
		if !found || u.Before(first) {
			first, found = u, true
		}
	}
	var last time.Time
	inEffect := false
	for _, cur := range cursors {
		switch {
		case cur.p.none:
		case !open && cur.w.kind == Deny && cur.activeAt(now), open && cur.w.kind == Allow && cur.activeAt(now):
			inEffect, last = true, later(last, cur.p.end)
		case !open && cur.w.kind == Allow && cur.p.start.After(now), open && cur.w.kind == Deny && cur.p.start.After(now):
			consider(cur.p.start)
		}
	}
	switch {
	case !open && inEffect:
		return last, true
	case open && inEffect:
		consider(last)
	}
	return first, found
}

// open is rule 1 at instant t, for cursors positioned at t.
func (c *Calendar) open(cursors []cursor, t time.Time) bool {
	allowed := !c.allows
	for _, cur := range cursors {
		if !cur.activeAt(t) {
			continue
		}
		if cur.w.kind == Deny {
			return false
		}
		allowed = true
	}
	return allowed
}

// sweep is the state of one search: where it stops and how much work is
// left.
type sweep struct {
	limit  time.Time
	budget int
}

// period is a window's span in effect: [start, end). unbounded means the
// span goes on past end, which is then where the search stopped knowing.
type period struct {
	start, end time.Time
	unbounded  bool
	none       bool // the window has no period left
}

// cursor walks one window's periods.
type cursor struct {
	w *compiled
	// after: p is the window's first period that ends after it.
	after time.Time
	p     period
}

// activeAt reports whether the cursor's period is in effect at t.
func (cur *cursor) activeAt(t time.Time) bool {
	return !cur.p.none && !t.Before(cur.p.start) && (cur.p.unbounded || t.Before(cur.p.end))
}

// advance moves the cursor to the window's first period that ends after
// cur.after, merging occurrences that overlap or touch. A period that goes
// on past the search's limit, or past where the budget ran out, is
// unbounded; the search then stops at its end.
func (cur *cursor) advance(s *sweep) {
	w := cur.w
	if w.schedule == nil {
		if w.end.After(cur.after) {
			cur.p = period{start: w.start, end: w.end}
		} else {
			cur.p = period{none: true}
		}
		return
	}
	// The first occurrence still in effect after cur.after started after
	// cur.after - duration, or, when the clocks went back since, up to
	// maxShift earlier (it lasts longer than its duration).
	from := cur.after.Add(-w.duration)
	if transitionIn(w.loc, from.Add(-maxShift), cur.after) {
		from = from.Add(-maxShift)
	}
	f := s.fire(w, from)
	for !f.IsZero() && f.Before(s.limit) && !occurrenceEnd(w.loc, f, w.duration).After(cur.after) {
		f = s.fire(w, f)
	}
	if f.IsZero() || !f.Before(s.limit) {
		cur.p = period{none: true}
		return
	}
	p := period{start: f, end: occurrenceEnd(w.loc, f, w.duration)}
	for next := s.fire(w, f); ; {
		if !p.end.Before(s.limit) {
			p.unbounded = true
			break
		}
		if next.IsZero() || next.After(p.end) {
			break // a gap: the period ends
		}
		if s.budget <= 0 {
			p.unbounded = true
			s.limit = p.end
			break
		}
		// next starts an occurrence within the period, which extends it.
		// Where the clocks do not change, a later start ends later, so of
		// several the latest extends it the most.
		after := s.fire(w, next)
		if !after.IsZero() && !after.After(p.end) && !transitionIn(w.loc, next, p.end) {
			next = s.latestFire(w, after, p.end)
			after = s.fire(w, next)
		}
		p.end = later(p.end, occurrenceEnd(w.loc, next, w.duration))
		next = after
	}
	cur.p = p
}

// maxShift bounds how far the clocks of a zone go back at once (Troll's
// two hours are the most in use): an occurrence lasts at most that much
// longer than its duration.
const maxShift = 3 * time.Hour

// transitionIn reports whether the clocks of loc change in (a, b].
func transitionIn(loc *time.Location, a, b time.Time) bool {
	_, end := a.In(loc).ZoneBounds()
	return !end.IsZero() && !end.After(b)
}

// occurrenceEnd is when an occurrence that starts at f ends: the first
// instant after f at which the clocks of loc show f's wall-clock time plus
// d, or skip past it. Where the clocks do not change that is f + d;
// across a change it is an hour (or the change) more or less, so that a
// window from Friday 18:00 for 62h ends on Monday at 08:00.
func occurrenceEnd(loc *time.Location, f time.Time, d time.Duration) time.Time {
	local := f.In(loc)
	_, offset := local.Zone()
	target := wall(f, offset).Add(d)
	t := f
	for range 64 {
		local := t.In(loc)
		_, offset := local.Zone()
		_, end := local.ZoneBounds()
		if t.After(f) && !wall(t, offset).Before(target) {
			return t // the clocks skipped past the target
		}
		if u := instant(target, offset); end.IsZero() || u.Before(end) {
			return u
		}
		t = end
	}
	return f.Add(d)
}

// latestFire is the window's last fire at or before hi, given a fire lo
// at or before it: a bisection, so that a window whose occurrences chain
// (every minute, for an hour each) is merged in a few dozen firings per
// duration instead of one per occurrence.
func (s *sweep) latestFire(w *compiled, lo, hi time.Time) time.Time {
	// lo is a fire at or before hi; no fire is in (up, hi].
	for up := hi; up.Sub(lo) > time.Minute; {
		mid := lo.Add(up.Sub(lo) / 2)
		if f := s.fire(w, mid); !f.IsZero() && !f.After(hi) {
			lo = f
		} else {
			up = mid
		}
	}
	for {
		f := s.fire(w, lo)
		if f.IsZero() || f.After(hi) {
			return lo
		}
		lo = f
	}
}

// fire is nextFire, counted against the budget.
func (s *sweep) fire(w *compiled, after time.Time) time.Time {
	s.budget--
	return nextFire(w.schedule, w.loc, after)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// nextFire is the first instant after t at which schedule fires in loc
// (rule 3), the zero time if none within about five years.
//
// The schedule is evaluated on wall-clock times written as UTC, which have
// no daylight saving; nextFire maps them to instants one offset period of
// loc at a time (time.Time.ZoneBounds): within a period an instant and its
// wall-clock time map one to one. At a transition that skips wall-clock
// times, a schedule that names one of them fires at the transition.
func nextFire(schedule *cron.SpecSchedule, loc *time.Location, t time.Time) time.Time {
	inclusive := false // whether t itself may be the fire
	for range 64 {
		local := t.In(loc)
		_, offset := local.Zone()
		_, end := local.ZoneBounds()
		probe := wall(t, offset)
		if inclusive {
			probe = probe.Add(-time.Nanosecond)
		}
		w := after(schedule, probe)
		if w.IsZero() {
			return time.Time{}
		}
		fire := instant(w, offset)
		if end.IsZero() || fire.Before(end) {
			return fire
		}
		_, next := end.In(loc).Zone()
		if next > offset {
			// Spring forward: wall-clock times [wall(end, offset),
			// wall(end, next)) do not exist.
			skipped := after(schedule, wall(end, offset).Add(-time.Nanosecond))
			if !skipped.IsZero() && skipped.Before(wall(end, next)) {
				return end
			}
		}
		t, inclusive = end, true
	}
	return time.Time{}
}

// after is the first wall-clock time after w that schedule names. A
// five-field schedule names whole minutes only; robfig's Next steps
// through the seconds from w on, so it is asked from the minute's last
// second.
func after(schedule *cron.SpecSchedule, w time.Time) time.Time {
	return schedule.Next(w.Truncate(time.Minute).Add(time.Minute - time.Second))
}

// wall is t's wall-clock time at offset seconds east of UTC, written as UTC.
func wall(t time.Time, offset int) time.Time {
	return t.Add(time.Duration(offset) * time.Second).UTC()
}

// instant is the instant whose wall-clock time at offset is w.
func instant(w time.Time, offset int) time.Time {
	return w.Add(-time.Duration(offset) * time.Second)
}
