package chaos

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/window"
)

// This file holds the checker's rules of deploy windows (issue 23):
//
//   - window-closed: no grant begins while its target is frozen (a Deny
//     window in effect, or outside every Allow window), but for a claim a
//     person overrode, whose override was in effect;
//   - override-recorded: a claim granted through a freeze by its override
//     says so in its Held status (the operator's audit, with the Event and
//     the metric the checker does not watch).
//
// The checker evaluates the windows with internal/window, the operator's
// own function: what it judges is the operator's apply (that it asks the
// function, with the policy it has, at the grant), not the function, which
// has its own tables. Windows change mid-run, and a manager sees a change
// later than the checker (or, when the checker's watch lags, earlier): a
// grant is judged against every version of the windows in effect from
// windowLag (at least Tolerance, at most PolicyLag) before it to as long
// after it, and is a violation only if each of them froze the target from
// Tolerance before the grant to Tolerance after it. (The workload adds its
// windows more than windowLag before they freeze the target.) Grants are judged at the end of the chaos
// phase (CheckWindows), once the claims' events, which come on another
// watch than the Leases', have arrived.

// windowLag is how long after the checker saw a change of a policy's
// windows a manager may still grant under the version before: its cache's
// lag behind the API server, through restarts and re-lists. It is shorter
// than PolicyLag, which covers the orderings, so that the windows the
// workload changes every few seconds can be judged at all.
const windowLag = 5 * time.Second

// overriddenNote is what the Held message of a claim granted through a
// freeze by its override says (arbiter's heldMessage).
const overriddenNote = "overridden by"

// windowVersion is a lock's spec.windows from an instant on (the checker's
// clock; zero: from the start). A version a re-list found may have taken
// effect at any instant since the checker's policy watch last delivered an
// event (since): it counts from then on, beside the version before it.
type windowVersion struct {
	from, since time.Time
	windows     []buildlockv1.Window
	cal         *window.Calendar
}

// overrideSeen is a claim's override annotations as the checker saw them.
type overrideSeen struct {
	reason, by string
	expires    time.Time
}

// heldSeen is the first Held status of a claim with a token that the
// checker saw, and whether its message named the override.
type heldSeen struct {
	at    time.Time
	noted bool
}

// windowGrant is a grant to judge against the windows at the end.
type windowGrant struct {
	e        Entry
	lock     LockKey
	name     string
	uid      types.UID
	token    int64
	acquired time.Time
}

// windowState is what the window rules follow; its zero value is ready.
type windowState struct {
	versions map[LockKey][]windowVersion
	// watched is when the policy watch last delivered an event.
	watched   time.Time
	overrides map[types.UID][]overrideSeen
	held      map[types.UID]map[int64]heldSeen
	pending   []windowGrant
	stats     WindowStats
}

// WindowStats count what the window rules judged.
type WindowStats struct {
	// Versions counts the changes of policies' windows seen.
	Versions int
	// Judged counts the grants judged against windows (of locks whose
	// policy had windows around the grant); Closed those granted while
	// every version froze the target, Edge those within Tolerance of a
	// window's edge or of a change of the windows (not judged).
	Judged, Closed, Edge int
	// Overridden counts the grants through a freeze by an override;
	// Recorded those whose Held status named it, Unjudged those whose
	// Held status was not seen while the freeze lasted.
	Overridden, Recorded, Unjudged int
	// Regrants counts grants of a claim granted before (a repair), not
	// judged: the hold began at the first.
	Regrants int
}

// observeWindows follows a lock's spec.windows from a policy event.
func (c *Checker) observeWindows(typ watch.EventType, p *buildlockv1.BuildLockPolicy, now time.Time, initial bool) {
	ws := c.win()
	if typ != Relisted {
		defer func() { ws.watched = now }()
	}
	lock := LockKey{p.Namespace, p.Name}
	var windows []buildlockv1.Window
	if typ != watch.Deleted {
		windows = p.Spec.Windows
	}
	vs := ws.versions[lock]
	if len(vs) == 0 && len(windows) == 0 {
		ws.versions[lock] = []windowVersion{{}}
		return
	}
	if len(vs) > 0 && sameWindows(vs[len(vs)-1].windows, windows) {
		return // the status changed, or another field of the spec
	}
	// A calendar that does not compile is frozen for good, as the
	// operator's is: Compile returns it with the error.
	cal, _ := window.Compile(window.FromPolicy(windows))
	v := windowVersion{from: now, since: now, windows: windows, cal: cal}
	if typ == Relisted && !ws.watched.IsZero() {
		v.since = ws.watched
	}
	if initial {
		v.from, v.since = time.Time{}, time.Time{}
	}
	switch {
	case initial:
	case len(vs) == 0:
		// Before its first policy event the lock had no windows.
		vs = []windowVersion{{}}
		fallthrough
	default:
		ws.stats.Versions++
	}
	ws.versions[lock] = append(vs, v)
}

// sameWindows compares two spec.windows as the API server stores them.
func sameWindows(a, b []buildlockv1.Window) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && string(ja) == string(jb)
}

func (c *Checker) win() *windowState {
	ws := &c.windows
	if ws.versions == nil {
		ws.versions, ws.overrides, ws.held = map[LockKey][]windowVersion{}, map[types.UID][]overrideSeen{}, map[types.UID]map[int64]heldSeen{}
	}
	return ws
}

// noteClaimWindows remembers a claim's override annotations and its first
// Held status with each token.
func (c *Checker) noteClaimWindows(bl *buildlockv1.BuildLock, now time.Time) {
	ws := c.win()
	if reason := bl.Annotations[buildlockv1.OverrideAnnotation]; reason != "" {
		o := overrideSeen{reason: reason, by: bl.Annotations[buildlockv1.OverriddenByAnnotation]}
		if t, err := time.Parse(time.RFC3339, bl.Annotations[buildlockv1.OverrideExpiresAnnotation]); err == nil {
			o.expires = t
		}
		seen := ws.overrides[bl.UID]
		if len(seen) == 0 || seen[len(seen)-1] != o {
			ws.overrides[bl.UID] = append(seen, o)
		}
	}
	if phaseOf(bl.Status.Phase) != buildlockv1.PhaseHeld || bl.Status.FencingToken == 0 {
		return
	}
	byToken := ws.held[bl.UID]
	if byToken == nil {
		byToken = map[int64]heldSeen{}
		ws.held[bl.UID] = byToken
	}
	if _, ok := byToken[bl.Status.FencingToken]; !ok {
		byToken[bl.Status.FencingToken] = heldSeen{at: now, noted: strings.Contains(bl.Status.Message, overriddenNote)}
	}
}

// noteWindowGrant queues a new grant for the window rules; regrant says
// the Lease named its holder before (the operator wrote it again).
func (c *Checker) noteWindowGrant(e Entry, lock LockKey, holder string, token int64, acquired time.Time, regrant bool) {
	ws := c.win()
	if len(ws.versions[lock]) == 0 || acquired.IsZero() {
		return
	}
	if regrant {
		ws.stats.Regrants++
		return
	}
	name, uid := buildlockv1.ParseGrantHolder(holder)
	ws.pending = append(ws.pending, windowGrant{e: e, lock: lock, name: name, uid: uid, token: token, acquired: acquired})
}

// versionsAround returns the versions of lock's windows in effect at some
// point of [from, to] (a version a re-list found, from when it may have
// taken effect).
func versionsAround(vs []windowVersion, from, to time.Time) []windowVersion {
	i := len(vs) - 1
	for i > 0 && vs[i].from.After(from) {
		i--
	}
	j := i
	for j+1 < len(vs) && !vs[j+1].since.After(to) {
		j++
	}
	return vs[i : j+1]
}

// frozenThrough reports whether cal freezes its target during all of
// [from, to], and until when it stays frozen.
func frozenThrough(cal *window.Calendar, from, to time.Time) (bool, time.Time) {
	s := cal.At(from)
	if s.Open {
		return false, time.Time{}
	}
	if !s.Changes {
		return true, time.Time{} // frozen beyond the look-ahead
	}
	return s.Next.After(to), s.Next
}

// CheckWindows judges the grants seen since it was last called against the
// windows of their targets: window-closed and override-recorded.
func (c *Checker) CheckWindows() {
	c.mu.Lock()
	defer c.mu.Unlock()
	ws := c.win()
	pending := ws.pending
	ws.pending = nil
	for _, g := range pending {
		c.judgeWindowGrant(ws, g)
	}
}

func (c *Checker) judgeWindowGrant(ws *windowState, g windowGrant) {
	tol := c.o.Tolerance
	lag := max(min(c.o.PolicyLag, windowLag), tol)
	vs := versionsAround(ws.versions[g.lock], g.acquired.Add(-lag), g.acquired.Add(lag))
	if len(vs) == 1 && len(vs[0].windows) == 0 {
		return // no windows around the grant
	}
	ws.stats.Judged++
	opensAt := time.Time{} // the earliest a version opens the target after the grant (zero: beyond the look-ahead)
	for _, v := range vs {
		frozen, until := frozenThrough(v.cal, g.acquired.Add(-tol), g.acquired.Add(tol))
		if !frozen {
			if !v.cal.At(g.acquired).Open || !v.cal.At(g.acquired.Add(-tol)).Open || !v.cal.At(g.acquired.Add(tol)).Open {
				ws.stats.Edge++
			}
			return
		}
		if !until.IsZero() && (opensAt.IsZero() || until.Before(opensAt)) {
			opensAt = until
		}
	}
	ws.stats.Closed++
	o, ok := c.overrideInEffect(ws, g)
	if !ok {
		c.violate(g.e, "window-closed", "%s was granted (token %d, acquired %s) while %s was frozen by its windows (%s), without an override in effect%s",
			g.name, g.token, g.acquired.Format("15:04:05.000"), g.lock, describeWindows(vs), o)
		return
	}
	ws.stats.Overridden++
	h, seen := ws.held[g.uid][g.token]
	switch {
	case seen && h.noted:
		ws.stats.Recorded++
	case !seen || (!opensAt.IsZero() && !opensAt.After(h.at.Add(tol))) || vs[len(vs)-1].from.After(g.acquired) && !vs[len(vs)-1].from.After(h.at.Add(tol)):
		// Never seen Held, or first seen Held once the freeze had ended
		// (or the windows had changed): its message rightly says nothing
		// of a freeze.
		ws.stats.Unjudged++
	default:
		c.violate(g.e, "override-recorded", "%s was granted through the freeze of %s by an override (%s), but its Held status does not say so (no %q in its message)",
			g.name, g.lock, o, overriddenNote)
	}
}

// overrideInEffect reports whether grant g's claim had an override in
// effect at the grant (within Tolerance) that a person requested (the
// ledger); the string says which, or why none counts.
func (c *Checker) overrideInEffect(ws *windowState, g windowGrant) (string, bool) {
	tol := c.o.Tolerance
	seen := ws.overrides[g.uid]
	if len(seen) == 0 {
		return "", false
	}
	requested := c.ledger.OverrideRequested(g.lock.Namespace, g.name)
	for _, o := range seen {
		inEffect := !o.expires.IsZero() && g.acquired.Add(-tol).Before(o.expires) && !o.expires.After(g.acquired.Add(buildlockv1.MaxOverrideFor+tol))
		if inEffect && requested {
			return fmt.Sprintf("%q by %q until %s", o.reason, o.by, o.expires.Format(time.RFC3339)), true
		}
	}
	last := seen[len(seen)-1]
	if !requested {
		return fmt.Sprintf(" (its override %q by %q is not one a person requested)", last.reason, last.by), false
	}
	return fmt.Sprintf(" (its override %q expires %s)", last.reason, last.expires.Format(time.RFC3339)), false
}

// describeWindows names the windows of versions vs, for a violation.
func describeWindows(vs []windowVersion) string {
	var parts []string
	for _, v := range vs {
		var ws []string
		for i, w := range v.windows {
			what := string(w.Kind) + " " + window.Name(v.windows, i)
			switch {
			case w.Schedule != "" && w.Duration != nil:
				what += fmt.Sprintf(" %q for %s", w.Schedule, w.Duration.Duration)
			case w.Start != nil && w.End != nil:
				what += fmt.Sprintf(" %s–%s", w.Start.Format("15:04:05.000"), w.End.Format("15:04:05.000"))
			}
			ws = append(ws, what)
		}
		from := "the start"
		if !v.from.IsZero() {
			from = v.from.Format("15:04:05.000")
		}
		parts = append(parts, fmt.Sprintf("from %s: [%s]", from, strings.Join(ws, ", ")))
	}
	return strings.Join(parts, "; ")
}

// WindowStats returns what the window rules judged.
func (c *Checker) WindowStats() WindowStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.win().stats
}

// PersonOverrides records that a person overrides claim ns/name (sets its
// override annotations).
func (l *Ledger) PersonOverrides(ns, name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.overrides == nil {
		l.overrides = map[string]bool{}
	}
	l.overrides[ns+"/"+name] = true
}

// OverrideRequested reports whether a person overrode claim ns/name.
func (l *Ledger) OverrideRequested(ns, name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.overrides[ns+"/"+name]
}

// checkFreezeStarted: a holder is Released as FreezeStarted only by a Deny
// window whose holder is Release and which started after the claim was
// granted (and before the checker saw it released), in some version of the
// windows since the grant.
func (c *Checker) checkFreezeStarted(e Entry, lv *lockView, cv *claimView, now time.Time) {
	if !c.freezeReleased(lv, cv, now) {
		c.violate(e, "released-for-a-reason", "%s Released as FreezeStarted but no Deny window with holder Release started while it held", cv.name)
	}
}

// freezeReleased reports whether a Deny window whose holder is Release
// started after cv was granted and by now, in some version of the windows
// since the grant: a freeze that ends cv's hold.
func (c *Checker) freezeReleased(lv *lockView, cv *claimView, now time.Time) bool {
	tol := c.o.Tolerance
	acquired, granted := c.acquiredAt(lv, cv)
	if !granted {
		acquired = cv.created
	}
	vs := c.win().versions[cv.lock]
	if len(vs) == 0 {
		return false
	}
	for _, v := range versionsAround(vs, acquired.Add(-max(min(c.o.PolicyLag, windowLag), tol)), now) {
		for _, w := range v.windows {
			if w.Kind != buildlockv1.WindowDeny || w.Holder != buildlockv1.WindowHolderRelease {
				continue
			}
			if w.Start == nil || (!w.Start.Before(acquired.Add(-tol)) && !w.Start.After(now.Add(tol))) {
				return true // a recurring one is not followed occurrence by occurrence
			}
		}
	}
	return false
}
