package window

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
)

// chooser makes the generator's choices: from a seeded random source in
// the property tests, from the fuzzer's bytes in FuzzCalendar.
type chooser interface {
	// intn returns a number in [0, n).
	intn(n int) int
}

type randomChooser struct{ r *rand.Rand }

func (c randomChooser) intn(n int) int { return c.r.IntN(n) }

func seeded(seed uint64) randomChooser {
	return randomChooser{rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// byteChooser reads one byte per choice, and chooses 0 once they run out.
type byteChooser struct{ data []byte }

func (c *byteChooser) intn(n int) int {
	if len(c.data) == 0 {
		return 0
	}
	v := int(c.data[0]) % n
	c.data = c.data[1:]
	return v
}

// The generator draws windows near daylight-saving changes, midnights and
// the year end, in zones that shift by an hour, half an hour and two hours,
// at midnight, or never.
var (
	genZones = []string{"", "UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Havana",
		"Antarctica/Troll", "Pacific/Chatham", "Asia/Kathmandu"}
	// genBases are the instants windows and questions are drawn around:
	// days before the changes of 2026 in Berlin, New York, Havana, Troll
	// (March, October), Lord Howe, Chatham (April, September, October),
	// and the year end.
	genBases = []string{"2026-03-06T00:00:00Z", "2026-03-27T00:00:00Z", "2026-04-03T00:00:00Z", "2026-09-25T00:00:00Z",
		"2026-10-02T00:00:00Z", "2026-10-23T00:00:00Z", "2026-10-30T00:00:00Z", "2026-12-29T00:00:00Z"}
	genDurations = []time.Duration{time.Minute, 20 * time.Minute, time.Hour, 90 * time.Minute, 3 * time.Hour, 26 * time.Hour, 62 * time.Hour}
	// genShortDurations keep the reference (which looks at every minute
	// of a duration) fast.
	genShortDurations = genDurations[:5]
	genFields         = []struct {
		min, max int
		names    []string
	}{
		{0, 59, nil}, {0, 23, nil}, {1, 31, nil},
		{1, 12, []string{"JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"}},
		{0, 6, []string{"SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"}},
	}
)

// genSchedule draws a valid five-field schedule; the minute and hour
// fields are mostly narrow, so that windows start a few times a day.
func genSchedule(ch chooser) string {
	fields := make([]string, 5)
	for i, f := range genFields {
		value := func() string {
			v := f.min + ch.intn(f.max-f.min+1)
			if f.names != nil && ch.intn(3) == 0 {
				return f.names[v-f.min]
			}
			return fmt.Sprint(v)
		}
		// Minutes and hours are mostly narrow, days and months mostly *,
		// so that windows start a few times a day or a week; dense
		// schedules, whose occurrences chain, come now and then.
		star := 0 // out of 6: how often the field is *
		switch {
		case i >= 2:
			star = 4
		case ch.intn(4) == 0:
			star = 1
		}
		switch k := ch.intn(6); {
		case k < star:
			fields[i] = "*"
		case k == 5 && i >= 1:
			fields[i] = fmt.Sprintf("*/%d", 2+ch.intn(5))
		case k == 4:
			a := f.min + ch.intn(f.max-f.min+1)
			b := a + ch.intn(f.max-a+1)
			fields[i] = fmt.Sprintf("%d-%d", a, b)
		case k == 3:
			fields[i] = value() + "," + value()
		default:
			fields[i] = value()
		}
	}
	return strings.Join(fields, " ")
}

// genWindow draws a window around base, recurring or one-off.
func genWindow(ch chooser, base time.Time, durations []time.Duration) Window {
	w := Window{Kind: Deny, TimeZone: genZones[ch.intn(len(genZones))]}
	if ch.intn(3) == 0 {
		w.Kind = Allow
	}
	if ch.intn(4) == 0 {
		w.Start = base.Add(time.Duration(ch.intn(14*24*60)-3*24*60) * time.Minute)
		w.End = w.Start.Add(durations[ch.intn(len(durations))] * time.Duration(1+ch.intn(3)))
		return w
	}
	// A schedule may name no date that exists (31 February); draw again.
	w.Schedule = "0 0 * * *"
	for range 10 {
		if s := genSchedule(ch); validSchedule(s) {
			w.Schedule = s
			break
		}
	}
	w.Duration = durations[ch.intn(len(durations))]
	return w
}

func validSchedule(s string) bool {
	_, err := parseSchedule(s)
	return err == nil
}

// genCase draws up to four windows and an instant to ask about.
func genCase(ch chooser, durations []time.Duration) ([]Window, time.Time) {
	base, _ := time.Parse(time.RFC3339, genBases[ch.intn(len(genBases))])
	ws := make([]Window, ch.intn(5))
	for i := range ws {
		ws[i] = genWindow(ch, base, durations)
	}
	at := base.Add(time.Duration(ch.intn(10*24*3600)) * time.Second).Add(time.Duration(ch.intn(1000)) * time.Millisecond)
	return ws, at
}

// reference says whether window w is in effect at u, by rules 2 and 3
// alone, minute by minute (the zones above have offsets in whole minutes,
// so schedules fire and clocks change on whole minutes): some instant f in
// the last duration plus maxShift fires, and from f to u the clocks have
// not yet shown f's wall-clock time plus the duration.
func reference(w Window, u time.Time) bool {
	if w.Schedule == "" {
		return !u.Before(w.Start) && u.Before(w.End)
	}
	parsed, err := parser.Parse(w.Schedule)
	if err != nil {
		panic(err)
	}
	spec := parsed.(*cron.SpecSchedule)
	fields := strings.Fields(w.Schedule)
	days := dayRule{domStar: strings.HasPrefix(fields[2], "*"), dowStar: strings.HasPrefix(fields[4], "*")}
	loc, err := location(w.TimeZone)
	if err != nil {
		panic(err)
	}
	last := u.Truncate(time.Minute)
	var minutes, walls []time.Time
	for m := last.Add(-w.Duration - maxShift); !m.After(last); m = m.Add(time.Minute) {
		_, offset := m.In(loc).Zone()
		minutes, walls = append(minutes, m), append(walls, wall(m, offset))
	}
	// shown[i] is the latest wall-clock time the clocks show in
	// minutes[i:].
	shown := make([]time.Time, len(walls)+1)
	for i := len(walls) - 1; i >= 0; i-- {
		shown[i] = walls[i]
		if shown[i+1].After(shown[i]) {
			shown[i] = shown[i+1]
		}
	}
	for i, m := range minutes {
		if firesAt(spec, days, loc, m) && shown[i+1].Before(walls[i].Add(w.Duration)) {
			return true
		}
	}
	return false
}

// dayRule is Vixie cron's rule for the day fields of a schedule: whether
// each one's text starts with '*' (then both must match; else one
// suffices).
type dayRule struct{ domStar, dowStar bool }

// firesAt says whether spec fires at instant m in loc: the clocks show a
// time it names, or m is a skip forward over one.
func firesAt(spec *cron.SpecSchedule, days dayRule, loc *time.Location, m time.Time) bool {
	if names(spec, days, m.In(loc)) {
		return true
	}
	_, before := m.Add(-time.Nanosecond).In(loc).Zone()
	_, after := m.In(loc).Zone()
	for skipped := wall(m, before); skipped.Before(wall(m, after)); skipped = skipped.Add(time.Minute) {
		if names(spec, days, skipped) {
			return true
		}
	}
	return false
}

// names says whether spec names the wall-clock time of c (its fields as
// its zone shows them), as Vixie cron reads day of month and day of week:
// both must match when either field's text starts with '*', one suffices
// otherwise.
func names(spec *cron.SpecSchedule, days dayRule, c time.Time) bool {
	bit := func(set uint64, v int) bool { return set&(1<<uint(v)) != 0 }
	if c.Second() != 0 || !bit(spec.Minute, c.Minute()) || !bit(spec.Hour, c.Hour()) || !bit(spec.Month, int(c.Month())) {
		return false
	}
	dom, dow := bit(spec.Dom, c.Day()), bit(spec.Dow, int(c.Weekday()))
	if days.domStar || days.dowStar {
		return dom && dow
	}
	return dom || dow
}

// referenceOpen is rule 1 over reference.
func referenceOpen(ws []Window, u time.Time) bool {
	allowed := true
	for _, w := range ws {
		if w.Kind == Allow {
			allowed = false
		}
	}
	for _, w := range ws {
		if reference(w, u) {
			if w.Kind == Deny {
				return false
			}
			allowed = true
		}
	}
	return allowed
}

// checkEdges checks the properties of At at t that need no reference:
//   - the next edge is never in the past;
//   - Open holds at every instant between t and the next edge (sampled,
//     and right before it), and differs from the edge on, when there is
//     one;
//   - asked again from any of those instants, the calendar finds the
//     same edge (or stops its search no later);
//   - the windows in effect hold t.
//
// It returns the state at t.
func checkEdges(cal *Calendar, t time.Time, ch chooser) (State, error) {
	s := cal.At(t)
	if !s.Next.After(t) {
		return s, fmt.Errorf("at %v: the next edge %v is not after it", t, s.Next)
	}
	if s.Changes {
		if after := cal.At(s.Next); after.Open == s.Open {
			return s, fmt.Errorf("at %v: open %v, and still %v at the reported edge %v", t, s.Open, after.Open, s.Next)
		}
	}
	span := s.Next.Sub(t)
	samples := []time.Time{t, s.Next.Add(-time.Nanosecond), s.Next.Add(-time.Second), s.Next.Add(-time.Minute)}
	for range 4 {
		samples = append(samples, t.Add(time.Duration(float64(span)*float64(ch.intn(1000))/1000)))
	}
	for _, u := range samples {
		if u.Before(t) || !u.Before(s.Next) {
			continue
		}
		su := cal.At(u)
		if su.Open != s.Open {
			return s, fmt.Errorf("at %v: open %v until %v (changes: %v), but at %v open %v", t, s.Open, s.Next, s.Changes, u, su.Open)
		}
		if s.Changes && (su.Next.After(s.Next) || (su.Changes && !su.Next.Equal(s.Next))) {
			return s, fmt.Errorf("at %v: the next edge is %v, but from %v it is %v (changes: %v)", t, s.Next, u, su.Next, su.Changes)
		}
	}
	for _, a := range s.Active {
		if a.Start.After(t) || (!a.End.IsZero() && !a.End.After(t)) {
			return s, fmt.Errorf("at %v: window %d reported in effect on [%v, %v)", t, a.Window, a.Start, a.End)
		}
	}
	return s, nil
}

// describe prints a case for a failure message.
func describe(ws []Window, t time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "at %s:\n", t.Format(time.RFC3339Nano))
	for i, w := range ws {
		if w.Schedule != "" {
			fmt.Fprintf(&b, "  %d: %v %q for %v in %q\n", i, w.Kind, w.Schedule, w.Duration, w.TimeZone)
		} else {
			fmt.Fprintf(&b, "  %d: %v from %s to %s (zone %q)\n", i, w.Kind, w.Start.Format(time.RFC3339), w.End.Format(time.RFC3339), w.TimeZone)
		}
	}
	return b.String()
}

// TestEdgesProperty: over random calendars, Open changes only at the edges
// At reports, four edges in a row.
func TestEdgesProperty(t *testing.T) {
	ch := seeded(1)
	for range 100 {
		ws, at := genCase(ch, genDurations)
		cal := compileOK(t, ws...)
		for range 4 {
			s, err := checkEdges(cal, at, ch)
			if err != nil {
				t.Fatalf("%v\n%s", err, describe(ws, at))
			}
			if !s.Changes {
				break
			}
			at = s.Next
		}
	}
}

// TestReferenceProperty: over random calendars with short durations, Open
// and the windows in effect are what rules 1–3 say by brute force, at
// random instants and right before and at every edge.
func TestReferenceProperty(t *testing.T) {
	ch := seeded(2)
	for range 150 {
		ws, at := genCase(ch, genShortDurations)
		cal := compileOK(t, ws...)
		for range 4 {
			s := cal.At(at)
			for _, u := range []time.Time{at, s.Next.Add(-time.Nanosecond), s.Next} {
				su := cal.At(u)
				if want := referenceOpen(ws, u); su.Open != want {
					t.Fatalf("at %v: open %v, the reference says %v\n%s", u, su.Open, want, describe(ws, at))
				}
				active := map[int]bool{}
				for _, a := range su.Active {
					active[a.Window] = true
				}
				for i, w := range ws {
					if reference(w, u) != active[i] {
						t.Fatalf("at %v: window %d in effect %v, the reference says %v\n%s", u, i, active[i], !active[i], describe(ws, at))
					}
				}
			}
			if !s.Changes {
				break
			}
			at = s.Next
		}
	}
}

// TestReferenceFindsEveryFire checks the reference itself on the
// daylight-saving table: at each fire it names, firesAt agrees.
func TestReferenceFindsEveryFire(t *testing.T) {
	for _, c := range []struct{ schedule, zone, from, to string }{
		{"30 2 * * *", "Europe/Berlin", "2026-03-28T00:00:00Z", "2026-03-31T00:00:00Z"},
		{"30 1 * * *", "America/New_York", "2026-10-31T00:00:00Z", "2026-11-03T00:00:00Z"},
		{"15,45 1,2 * * *", "Australia/Lord_Howe", "2026-10-03T00:00:00Z", "2026-10-05T00:00:00Z"},
	} {
		got := firesBetween(t, c.schedule, c.zone, c.from, c.to)
		parsed, _ := parser.Parse(c.schedule)
		loc, _ := time.LoadLocation(c.zone)
		var want []string
		for m := rfc(t, c.from); m.Before(rfc(t, c.to)); m = m.Add(time.Minute) {
			if firesAt(parsed.(*cron.SpecSchedule), dayRule{domStar: true, dowStar: true}, loc, m) {
				want = append(want, m.In(loc).Format(time.RFC3339))
			}
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s in %s: nextFire finds %v, the reference %v", c.schedule, c.zone, got, want)
		}
	}
}
