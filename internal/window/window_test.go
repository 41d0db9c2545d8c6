package window

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// rfc parses an RFC 3339 time, or fails the test.
func rfc(t testing.TB, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// compileOK compiles windows that must be valid.
func compileOK(t testing.TB, ws ...Window) *Calendar {
	t.Helper()
	c, err := Compile(ws)
	if err != nil {
		t.Fatalf("compiling %+v: %v", ws, err)
	}
	return c
}

// firesBetween lists, in RFC 3339 with the zone's offset, the instants in
// [from, to) at which schedule fires in zone.
func firesBetween(t *testing.T, schedule, zone, from, to string) []string {
	t.Helper()
	c := compileOK(t, Window{Kind: Deny, Schedule: schedule, Duration: time.Minute, TimeZone: zone})
	w := c.windows[0]
	end := rfc(t, to)
	var got []string
	for f := nextFire(w.schedule, w.loc, rfc(t, from).Add(-time.Nanosecond)); !f.IsZero() && f.Before(end); f = nextFire(w.schedule, w.loc, f) {
		got = append(got, f.In(w.loc).Format(time.RFC3339))
	}
	return got
}

// TestFiresAcrossDaylightSaving pins rule 3 on the days the clocks change,
// in both directions, in zones that shift by an hour (Berlin, New York,
// Havana at midnight), by half an hour (Lord Howe), by two hours (Troll),
// and by an hour off a 45-minute offset (Chatham).
func TestFiresAcrossDaylightSaving(t *testing.T) {
	for name, c := range map[string]struct {
		schedule, zone, from, to string
		want                     []string
	}{
		// Berlin springs forward on 2026-03-29 at 02:00 CET to 03:00 CEST.
		"Berlin, spring forward: a daily 02:30, which does not exist that day, fires once at the skip (03:00 CEST)": {
			"30 2 * * *", "Europe/Berlin", "2026-03-28T00:00:00+01:00", "2026-03-31T00:00:00+02:00",
			[]string{"2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"},
		},
		"Berlin, spring forward: 02:00 and 02:30 both skipped fire once, at the skip, with 03:00": {
			"*/30 1-3 29 3 *", "Europe/Berlin", "2026-03-29T00:00:00+01:00", "2026-03-30T00:00:00+02:00",
			[]string{"2026-03-29T01:00:00+01:00", "2026-03-29T01:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-29T03:30:00+02:00"},
		},
		"Berlin, spring forward: 03:00, which exists, fires once": {
			"0 3 * * *", "Europe/Berlin", "2026-03-29T00:00:00+01:00", "2026-03-30T00:00:00+02:00",
			[]string{"2026-03-29T03:00:00+02:00"},
		},
		// Berlin falls back on 2026-10-25 at 03:00 CEST to 02:00 CET.
		"Berlin, fall back: a daily 02:30, which the clocks show twice, fires twice": {
			"30 2 * * *", "Europe/Berlin", "2026-10-24T00:00:00+02:00", "2026-10-27T00:00:00+01:00",
			[]string{"2026-10-24T02:30:00+02:00", "2026-10-25T02:30:00+02:00", "2026-10-25T02:30:00+01:00", "2026-10-26T02:30:00+01:00"},
		},
		"Berlin, fall back: a daily 01:30, before the repeated hour, fires once": {
			"30 1 * * *", "Europe/Berlin", "2026-10-25T00:00:00+02:00", "2026-10-26T00:00:00+01:00",
			[]string{"2026-10-25T01:30:00+02:00"},
		},
		// New York springs forward on 2026-03-08 at 02:00 EST to 03:00 EDT,
		// and falls back on 2026-11-01 at 02:00 EDT to 01:00 EST.
		"New York, spring forward: a daily 02:30 fires once at the skip (03:00 EDT)": {
			"30 2 * * *", "America/New_York", "2026-03-07T00:00:00-05:00", "2026-03-10T00:00:00-04:00",
			[]string{"2026-03-07T02:30:00-05:00", "2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"},
		},
		"New York, fall back: a daily 01:30 fires twice, in EDT and in EST": {
			"30 1 * * *", "America/New_York", "2026-10-31T00:00:00-04:00", "2026-11-03T00:00:00-05:00",
			[]string{"2026-10-31T01:30:00-04:00", "2026-11-01T01:30:00-04:00", "2026-11-01T01:30:00-05:00", "2026-11-02T01:30:00-05:00"},
		},
		"New York, fall back: every 20 minutes of the repeated hour fires in both": {
			"*/20 1 1 11 *", "America/New_York", "2026-11-01T00:00:00-04:00", "2026-11-02T00:00:00-05:00",
			[]string{"2026-11-01T01:00:00-04:00", "2026-11-01T01:20:00-04:00", "2026-11-01T01:40:00-04:00",
				"2026-11-01T01:00:00-05:00", "2026-11-01T01:20:00-05:00", "2026-11-01T01:40:00-05:00"},
		},
		"New York, a weekly window is not moved by the change": {
			"0 18 * * FRI", "America/New_York", "2026-10-29T00:00:00-04:00", "2026-11-14T00:00:00-05:00",
			[]string{"2026-10-30T18:00:00-04:00", "2026-11-06T18:00:00-05:00", "2026-11-13T18:00:00-05:00"},
		},
		// Havana changes at midnight: 2026-03-08 00:00 CST to 01:00 CDT, and
		// 2026-11-01 01:00 CDT back to 00:00 CST.
		"Havana, spring forward at midnight: a daily 00:00 fires at the skip (01:00 CDT)": {
			"0 0 * * *", "America/Havana", "2026-03-07T00:00:00-05:00", "2026-03-10T00:00:00-04:00",
			[]string{"2026-03-07T00:00:00-05:00", "2026-03-08T01:00:00-04:00", "2026-03-09T00:00:00-04:00"},
		},
		"Havana, spring forward: a Sunday-only 00:30 still fires on the Sunday that has no midnight": {
			"30 0 * * SUN", "America/Havana", "2026-03-01T12:00:00-05:00", "2026-03-16T00:00:00-04:00",
			[]string{"2026-03-08T01:00:00-04:00", "2026-03-15T00:30:00-04:00"},
		},
		"Havana, fall back at 01:00: a daily 00:30 fires twice": {
			"30 0 * * *", "America/Havana", "2026-11-01T00:00:00-04:00", "2026-11-02T00:00:00-05:00",
			[]string{"2026-11-01T00:30:00-04:00", "2026-11-01T00:30:00-05:00"},
		},
		// Lord Howe shifts by half an hour: 2026-10-04 02:00 to 02:30, and
		// 2026-04-05 02:00 back to 01:30.
		"Lord Howe, spring forward by 30 minutes: 02:15 fires at the skip (02:30)": {
			"15 2 * * *", "Australia/Lord_Howe", "2026-10-03T12:00:00+10:30", "2026-10-05T12:00:00+11:00",
			[]string{"2026-10-04T02:30:00+11:00", "2026-10-05T02:15:00+11:00"},
		},
		"Lord Howe, fall back by 30 minutes: 01:45 fires twice, 01:15 once": {
			"15,45 1 5 4 *", "Australia/Lord_Howe", "2026-04-05T00:00:00+11:00", "2026-04-06T00:00:00+10:30",
			[]string{"2026-04-05T01:15:00+11:00", "2026-04-05T01:45:00+11:00", "2026-04-05T01:45:00+10:30"},
		},
		// Troll shifts by two hours: 2026-03-29 01:00 +00 to 03:00 +02.
		"Troll, spring forward by two hours: 01:30 and 02:30 both fire once, at the skip": {
			"30 1,2 29 3 *", "Antarctica/Troll", "2026-03-29T00:00:00Z", "2026-03-30T00:00:00+02:00",
			[]string{"2026-03-29T03:00:00+02:00"},
		},
		"Troll, fall back by two hours: 01:30 and 02:30 each fire twice": {
			"30 1,2 25 10 *", "Antarctica/Troll", "2026-10-25T00:00:00+02:00", "2026-10-26T00:00:00Z",
			[]string{"2026-10-25T01:30:00+02:00", "2026-10-25T02:30:00+02:00", "2026-10-25T01:30:00Z", "2026-10-25T02:30:00Z"},
		},
		// Chatham: 2026-09-27 02:45 +12:45 to 03:45 +13:45.
		"Chatham, spring forward off a 45-minute offset: 03:00 fires at the skip (03:45)": {
			"0 3 27 9 *", "Pacific/Chatham", "2026-09-27T00:00:00+12:45", "2026-09-28T00:00:00+13:45",
			[]string{"2026-09-27T03:45:00+13:45"},
		},
		"UTC has no change": {
			"30 2 * * *", "UTC", "2026-03-29T00:00:00Z", "2026-03-31T00:00:00Z",
			[]string{"2026-03-29T02:30:00Z", "2026-03-30T02:30:00Z"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			got := firesBetween(t, c.schedule, c.zone, c.from, c.to)
			if strings.Join(got, " ") != strings.Join(c.want, " ") {
				t.Errorf("fires:\n got %v\nwant %v", got, c.want)
			}
		})
	}
}

// TestCalendar is rule 1 and 2 at chosen instants: what is in effect, and
// the next change.
func TestCalendar(t *testing.T) {
	weekend := Window{Kind: Deny, Schedule: "0 18 * * FRI", Duration: 62 * time.Hour, TimeZone: "Europe/Berlin"}
	officeHours := Window{Kind: Allow, Schedule: "0 8 * * MON-FRI", Duration: 10 * time.Hour, TimeZone: "Europe/Berlin"}
	oneOff := func(kind Kind, start, end string) Window {
		return Window{Kind: kind, Start: rfc(t, start), End: rfc(t, end)}
	}
	for name, c := range map[string]struct {
		windows []Window
		at      string
		open    bool
		active  []int  // windows in effect, in State.Active's order
		next    string // "" when nothing changes within the search
	}{
		"no windows: open, never changes": {
			at: "2026-06-01T12:00:00Z", open: true,
		},
		"weekend freeze: open on Friday before 18:00, freezes at 18:00": {
			windows: []Window{weekend}, at: "2026-06-05T17:59:59+02:00", open: true, next: "2026-06-05T18:00:00+02:00",
		},
		"weekend freeze: frozen at 18:00 itself (the start is inside)": {
			windows: []Window{weekend}, at: "2026-06-05T18:00:00+02:00", active: []int{0}, next: "2026-06-08T08:00:00+02:00",
		},
		"weekend freeze: frozen on Sunday, opens Monday 08:00": {
			windows: []Window{weekend}, at: "2026-06-07T23:00:00+02:00", active: []int{0}, next: "2026-06-08T08:00:00+02:00",
		},
		"weekend freeze: open at Monday 08:00 itself (the end is outside)": {
			windows: []Window{weekend}, at: "2026-06-08T08:00:00+02:00", open: true, next: "2026-06-12T18:00:00+02:00",
		},
		"a weekend freeze across the fall-back change still ends at Monday 08:00, after 63 hours": {
			windows: []Window{weekend}, at: "2026-10-24T12:00:00+02:00", active: []int{0}, next: "2026-10-26T08:00:00+01:00",
		},
		"a weekend freeze across the spring-forward change still ends at Monday 08:00, after 61 hours": {
			windows: []Window{weekend}, at: "2026-03-28T12:00:00+01:00", active: []int{0}, next: "2026-03-30T08:00:00+02:00",
		},
		"a nightly freeze over the fall-back night ends at 06:00 on the clock, after 9 hours": {
			windows: []Window{{Kind: Deny, Schedule: "0 22 * * *", Duration: 8 * time.Hour, TimeZone: "America/New_York"}},
			at:      "2026-11-01T01:30:00-05:00", active: []int{0}, next: "2026-11-01T06:00:00-05:00",
		},
		"a freeze of 20 minutes from 02:30, a time the spring-forward day skips, runs 03:00 to 03:20": {
			windows: []Window{{Kind: Deny, Schedule: "30 2 * * *", Duration: 20 * time.Minute, TimeZone: "Europe/Berlin"}},
			at:      "2026-03-29T03:10:00+02:00", active: []int{0}, next: "2026-03-29T03:20:00+02:00",
		},
		"a freeze of 2 hours from 01:00 on the spring-forward day ends at 03:00 on the clock, after an hour": {
			windows: []Window{{Kind: Deny, Schedule: "0 1 * * *", Duration: 2 * time.Hour, TimeZone: "Europe/Berlin"}},
			at:      "2026-03-29T01:30:00+01:00", active: []int{0}, next: "2026-03-29T03:00:00+02:00",
		},
		"office hours only: frozen before 08:00": {
			windows: []Window{officeHours}, at: "2026-06-02T07:00:00+02:00", next: "2026-06-02T08:00:00+02:00",
		},
		"office hours only: open at noon until 18:00": {
			windows: []Window{officeHours}, at: "2026-06-02T12:00:00+02:00", open: true, active: []int{0}, next: "2026-06-02T18:00:00+02:00",
		},
		"office hours only: frozen from Friday 18:00 to Monday 08:00": {
			windows: []Window{officeHours}, at: "2026-06-05T18:00:00+02:00", next: "2026-06-08T08:00:00+02:00",
		},
		"deny beats allow: a lunch freeze inside office hours": {
			windows: []Window{officeHours, oneOff(Deny, "2026-06-02T12:00:00+02:00", "2026-06-02T13:00:00+02:00")},
			at:      "2026-06-02T12:30:00+02:00", active: []int{1, 0}, next: "2026-06-02T13:00:00+02:00",
		},
		"deny beats allow: a freeze that outlasts office hours opens only at the next office hours": {
			windows: []Window{officeHours, oneOff(Deny, "2026-06-02T17:00:00+02:00", "2026-06-02T20:00:00+02:00")},
			at:      "2026-06-02T17:30:00+02:00", active: []int{1, 0}, next: "2026-06-03T08:00:00+02:00",
		},
		"an Allow window inside a weekend freeze opens nothing, and outside it the target is frozen for good": {
			windows: []Window{weekend, oneOff(Allow, "2026-06-06T10:00:00+02:00", "2026-06-06T11:00:00+02:00")},
			at:      "2026-06-06T10:30:00+02:00", active: []int{0, 1},
		},
		"an Allow window that outlasts a freeze opens the target when the freeze ends": {
			windows: []Window{weekend, oneOff(Allow, "2026-06-06T10:00:00+02:00", "2026-06-09T11:00:00+02:00")},
			at:      "2026-06-06T10:30:00+02:00", active: []int{0, 1}, next: "2026-06-08T08:00:00+02:00",
		},
		"overlapping freezes: frozen until the last ends; the longest-lasting first": {
			windows: []Window{oneOff(Deny, "2026-06-02T10:00:00Z", "2026-06-02T12:00:00Z"), oneOff(Deny, "2026-06-02T11:00:00Z", "2026-06-02T14:00:00Z")},
			at:      "2026-06-02T11:30:00Z", active: []int{1, 0}, next: "2026-06-02T14:00:00Z",
		},
		"touching freezes: no opening between them": {
			windows: []Window{oneOff(Deny, "2026-06-02T10:00:00Z", "2026-06-02T12:00:00Z"), oneOff(Deny, "2026-06-02T12:00:00Z", "2026-06-02T14:00:00Z")},
			at:      "2026-06-02T10:30:00Z", active: []int{0}, next: "2026-06-02T14:00:00Z",
		},
		"touching Allow windows: no freeze between them": {
			windows: []Window{oneOff(Allow, "2026-06-02T10:00:00Z", "2026-06-02T12:00:00Z"), oneOff(Allow, "2026-06-02T12:00:00Z", "2026-06-02T14:00:00Z")},
			at:      "2026-06-02T11:00:00Z", open: true, active: []int{0}, next: "2026-06-02T14:00:00Z",
		},
		"a nightly freeze spans midnight": {
			windows: []Window{{Kind: Deny, Schedule: "0 22 * * *", Duration: 8 * time.Hour, TimeZone: "America/New_York"}},
			at:      "2026-06-02T23:30:00-04:00", active: []int{0}, next: "2026-06-03T06:00:00-04:00",
		},
		"a nightly freeze: open at 06:00 until 22:00": {
			windows: []Window{{Kind: Deny, Schedule: "0 22 * * *", Duration: 8 * time.Hour, TimeZone: "America/New_York"}},
			at:      "2026-06-03T06:00:00-04:00", open: true, next: "2026-06-03T22:00:00-04:00",
		},
		"a holiday freeze spans the year end": {
			windows: []Window{{Kind: Deny, Schedule: "0 18 24 12 *", Duration: 16 * 24 * time.Hour, TimeZone: "Europe/Berlin"}},
			at:      "2026-12-31T23:59:59+01:00", active: []int{0}, next: "2027-01-09T18:00:00+01:00",
		},
		"after the holiday freeze, the next one is 349 days ahead, within the look-ahead": {
			windows: []Window{{Kind: Deny, Schedule: "0 18 24 12 *", Duration: 16 * 24 * time.Hour, TimeZone: "Europe/Berlin"}},
			at:      "2027-01-10T00:00:00+01:00", open: true, next: "2027-12-24T18:00:00+01:00",
		},
		"a one-off freeze across the year end, in New York": {
			windows: []Window{oneOff(Deny, "2026-12-31T20:00:00-05:00", "2027-01-01T02:00:00-05:00")},
			at:      "2027-01-01T00:00:00-05:00", active: []int{0}, next: "2027-01-01T02:00:00-05:00",
		},
		"a one-off freeze that is over changes nothing": {
			windows: []Window{oneOff(Deny, "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z")},
			at:      "2026-06-01T00:00:00Z", open: true,
		},
		"a one-off Allow window that is over keeps the target frozen for good": {
			windows: []Window{oneOff(Allow, "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z")},
			at:      "2026-06-01T00:00:00Z",
		},
		"a freeze longer than the look-ahead: frozen, no change found": {
			windows: []Window{oneOff(Deny, "2026-01-01T00:00:00Z", "2030-01-01T00:00:00Z")},
			at:      "2026-06-01T00:00:00Z", active: []int{0},
		},
		"the spring-forward day's 02:30 freeze starts at the skip and lasts its hour": {
			windows: []Window{{Kind: Deny, Schedule: "30 2 * * *", Duration: time.Hour, TimeZone: "Europe/Berlin"}},
			at:      "2026-03-29T03:30:00+02:00", active: []int{0}, next: "2026-03-29T04:00:00+02:00",
		},
		"the fall-back night's two 01:30 freezes of an hour touch: frozen 01:30 EDT to 02:30 EST": {
			windows: []Window{{Kind: Deny, Schedule: "30 1 * * *", Duration: time.Hour, TimeZone: "America/New_York"}},
			at:      "2026-11-01T01:45:00-04:00", active: []int{0}, next: "2026-11-01T02:30:00-05:00",
		},
		"the fall-back night's two 01:30 freezes of 20 minutes: open between them": {
			windows: []Window{{Kind: Deny, Schedule: "30 1 * * *", Duration: 20 * time.Minute, TimeZone: "America/New_York"}},
			at:      "2026-11-01T01:55:00-04:00", open: true, next: "2026-11-01T01:30:00-05:00",
		},
	} {
		t.Run(name, func(t *testing.T) {
			cal := compileOK(t, c.windows...)
			at := rfc(t, c.at)
			s := cal.At(at)
			if s.Open != c.open {
				t.Errorf("open: got %v, want %v", s.Open, c.open)
			}
			var active []int
			for _, a := range s.Active {
				active = append(active, a.Window)
				if a.Kind != c.windows[a.Window].Kind {
					t.Errorf("active window %d has kind %v, not its own", a.Window, a.Kind)
				}
				if a.Start.After(at) || (!a.End.IsZero() && !a.End.After(at)) {
					t.Errorf("active window %d spans [%v, %v), which does not hold %v", a.Window, a.Start, a.End, at)
				}
			}
			if !equalInts(active, c.active) {
				t.Errorf("active: got %v, want %v", active, c.active)
			}
			switch {
			case c.next == "" && s.Changes:
				t.Errorf("next: got a change at %v, want none", s.Next)
			case c.next == "" && !s.Next.Equal(at.Add(Horizon)):
				t.Errorf("next: got the search's end at %v, want the look-ahead's %v", s.Next, at.Add(Horizon))
			case c.next != "" && (!s.Changes || !s.Next.Equal(rfc(t, c.next))):
				t.Errorf("next: got %v (changes: %v), want a change at %v", s.Next, s.Changes, c.next)
			}
		})
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestActiveWindowSpans checks the spans State.Active reports: a recurring
// window's occurrence, merged occurrences, and an end past the search.
func TestActiveWindowSpans(t *testing.T) {
	cal := compileOK(t,
		Window{Kind: Deny, Schedule: "30 1 * * *", Duration: time.Hour, TimeZone: "America/New_York"},
		Window{Kind: Deny, Start: rfc(t, "2026-01-01T00:00:00Z"), End: rfc(t, "2030-01-01T00:00:00Z")},
	)
	s := cal.At(rfc(t, "2026-11-01T01:15:00-05:00"))
	if len(s.Active) != 2 {
		t.Fatalf("active: %+v", s.Active)
	}
	long, night := s.Active[0], s.Active[1]
	if long.Window != 1 || !long.End.IsZero() || !long.Start.Equal(rfc(t, "2026-01-01T00:00:00Z")) {
		t.Errorf("the freeze past the look-ahead: %+v, want window 1 from 2026-01-01 with no end", long)
	}
	// The first 01:30 (EDT) lasts until the clocks show 02:30, which is
	// in EST; the second 01:30 (EST) merges into it.
	if night.Window != 0 || !night.Start.Equal(rfc(t, "2026-11-01T01:30:00-04:00")) || !night.End.Equal(rfc(t, "2026-11-01T02:30:00-05:00")) {
		t.Errorf("the fall-back night: %+v, want window 0 from 01:30 EDT to 02:30 EST", night)
	}
}

// TestCompileRefuses checks that every window the API server would refuse,
// and what it cannot refuse, is an error that names the window, and that
// the calendar then fails closed (rule 4).
func TestCompileRefuses(t *testing.T) {
	start := rfc(t, "2026-12-24T00:00:00+01:00")
	for name, c := range map[string]struct {
		w    Window
		want string
	}{
		"a schedule that never fires (30 February)":                         {Window{Kind: Deny, Schedule: "0 0 30 2 *", Duration: time.Hour}, "never fires"},
		"a schedule that never fires (31 April, June, September, November)": {Window{Kind: Allow, Schedule: "0 0 31 4,6,9,11 *", Duration: time.Hour}, "never fires"},
		"a downward range":                      {Window{Kind: Deny, Schedule: "0 18 * * FRI-MON", Duration: time.Hour}, "beyond end of range"},
		"a schedule of six fields":              {Window{Kind: Deny, Schedule: "0 0 18 * * FRI", Duration: time.Hour}, "five fields"},
		"a descriptor":                          {Window{Kind: Deny, Schedule: "@daily", Duration: time.Hour}, "five fields"},
		"a CRON_TZ prefix without a space":      {Window{Kind: Deny, Schedule: "CRON_TZ=UTC", Duration: time.Hour}, "five fields"},
		"minute 60":                             {Window{Kind: Deny, Schedule: "60 * * * *", Duration: time.Hour}, "minute field"},
		"day of week 7":                         {Window{Kind: Deny, Schedule: "0 0 * * 7", Duration: time.Hour}, "day of week field"},
		"an unknown time zone":                  {Window{Kind: Deny, Schedule: "0 0 * * *", Duration: time.Hour, TimeZone: "Europe/Berln"}, "not in the operator's time-zone database"},
		"Local":                                 {Window{Kind: Deny, Schedule: "0 0 * * *", Duration: time.Hour, TimeZone: "Local"}, "not an IANA"},
		"an offset":                             {Window{Kind: Deny, Schedule: "0 0 * * *", Duration: time.Hour, TimeZone: "+01:00"}, "not an IANA"},
		"a zero duration":                       {Window{Kind: Deny, Schedule: "0 0 * * *"}, "duration 0s is not between"},
		"a negative duration":                   {Window{Kind: Deny, Schedule: "0 0 * * *", Duration: -time.Hour}, "not between"},
		"a duration over 366 days":              {Window{Kind: Deny, Schedule: "0 0 * * *", Duration: 367 * 24 * time.Hour}, "not between"},
		"a duration without a schedule":         {Window{Kind: Deny, Duration: time.Hour}, "is not five fields"},
		"an end before its start":               {Window{Kind: Deny, Start: start, End: start.Add(-time.Hour)}, "is not after its start"},
		"an end equal to its start":             {Window{Kind: Deny, Start: start, End: start}, "is not after its start"},
		"a start without an end":                {Window{Kind: Deny, Start: start}, "needs both start and end"},
		"both forms":                            {Window{Kind: Deny, Schedule: "0 0 * * *", Duration: time.Hour, Start: start, End: start.Add(time.Hour)}, "either recurring"},
		"neither form":                          {Window{Kind: Deny}, "either recurring"},
		"no kind":                               {Window{Start: start, End: start.Add(time.Hour)}, "neither Deny nor Allow"},
		"a schedule longer than 100 characters": {Window{Kind: Deny, Schedule: strings.Repeat("1,", 60) + "1 * * * *", Duration: time.Hour}, "longer than 100"},
	} {
		t.Run(name, func(t *testing.T) {
			valid := Window{Kind: Allow, Schedule: "0 0 * * *", Duration: 24 * time.Hour}
			cal, err := Compile([]Window{valid, c.w})
			var werr *Error
			if !errors.As(err, &werr) || werr.Window != 1 || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error of window 1 with %q", err, c.want)
			}
			t.Logf("%v", err)
			s := cal.At(start)
			if s.Open || s.Changes || len(s.Active) != 0 || !s.Next.Equal(start.Add(Horizon)) {
				t.Errorf("an invalid calendar must be frozen for good; got %+v", s)
			}
		})
	}
}

// TestLocation gives each window's zone, UTC for what has none.
func TestLocation(t *testing.T) {
	cal := compileOK(t, Window{Kind: Deny, Schedule: "0 0 * * *", Duration: time.Hour, TimeZone: "Europe/Berlin"},
		Window{Kind: Deny, Schedule: "0 0 * * *", Duration: time.Hour})
	for i, want := range map[int]string{0: "Europe/Berlin", 1: "UTC", 2: "UTC", -1: "UTC"} {
		if got := cal.Location(i).String(); got != want {
			t.Errorf("Location(%d) = %s, want %s", i, got, want)
		}
	}
	var none *Calendar
	if !none.At(time.Now()).Open || none.Location(0) != time.UTC {
		t.Error("a nil calendar must be open, in UTC")
	}
}

// TestBudget: a schedule that fires every minute and chains for ever
// stops the search where the work bound runs out, without a change, and
// the state holds there.
func TestBudget(t *testing.T) {
	cal := compileOK(t, Window{Kind: Deny, Schedule: "* * * * *", Duration: time.Minute})
	at := rfc(t, "2026-06-01T00:00:30Z")
	s := cal.At(at)
	if s.Open || s.Changes || !s.Next.After(at) || !s.Next.Before(at.Add(Horizon)) {
		t.Fatalf("got %+v, want frozen with no change, the search cut short after %v", s, at)
	}
	if later := cal.At(s.Next); later.Open {
		t.Errorf("at the end of the cut search the state changed: %+v", later)
	}
	// Many short windows that change nothing under a long freeze are
	// jumped over: the search reaches the look-ahead.
	cal = compileOK(t, Window{Kind: Deny, Schedule: "*/2 * * * *", Duration: time.Minute},
		Window{Kind: Allow, Schedule: "* * * * *", Duration: 24 * time.Hour},
		Window{Kind: Deny, Start: at.Add(-time.Hour), End: at.Add(2 * Horizon)})
	if s := cal.At(at); s.Open || s.Changes || !s.Next.Equal(at.Add(Horizon)) {
		t.Fatalf("got %+v, want frozen with no change within the look-ahead", s)
	}
	// An Allow window whose occurrences chain for a year (every minute,
	// for a day each: half a million occurrences) is merged by bisection,
	// within the budget.
	cal = compileOK(t, Window{Kind: Allow, Schedule: "* * * * *", Duration: 24 * time.Hour})
	if s := cal.At(at); !s.Open || s.Changes || !s.Next.Equal(at.Add(Horizon)) {
		t.Fatalf("got %+v, want open with no change within the look-ahead", s)
	}
}

// TestTheDayRuleIsVixieCrons (issue 31): when both day fields are
// restricted, a day matching either is enough; but, as in Vixie cron and
// cronie, a day field that starts with '*' counts as unrestricted, so that
// "0 0 */2 * MON" fires on the odd days that are Mondays, not on every odd
// day and every Monday. Its days in December 2026 (Mondays: 7, 14, 21, 28):
func TestTheDayRuleIsVixieCrons(t *testing.T) {
	days := func(fires []string) string {
		var out []string
		for _, f := range fires {
			out = append(out, strings.TrimLeft(f[8:10], "0"))
		}
		return strings.Join(out, ",")
	}
	for schedule, want := range map[string]string{
		"0 0 */2 * MON":    "7,21",                                                                                // starts with '*': odd days that are Mondays
		"0 0 */2 * 1-2":    "1,7,15,21,29",                                                                        // odd Mondays and Tuesdays
		"0 0 1-31/2 * MON": "1,3,5,7,9,11,13,14,15,17,19,21,23,25,27,28,29,31",                                    // a range, not '*': odd days or Mondays
		"0 0 1,15 * MON":   "1,7,14,15,21,28",                                                                     // both restricted: either
		"0 0 * * MON":      "7,14,21,28",                                                                          // day of month unrestricted
		"0 0 1,15 * *":     "1,15",                                                                                // day of week unrestricted
		"0 0 *,10 * MON":   "7,14,21,28",                                                                          // starts with '*': both must match
		"0 0 10,* * MON":   "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31", // does not: either
		"0 0 10 * */3":     "",                                                                                    // Thursday the 10th is no Sunday, Wednesday or Saturday
	} {
		got := days(firesBetween(t, schedule, "UTC", "2026-12-01T00:00:00Z", "2027-01-01T00:00:00Z"))
		if got != want {
			t.Errorf("%q fires in December 2026 on %q, want %q", schedule, got, want)
		}
	}
}
