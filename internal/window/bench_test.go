package window

import (
	"testing"
	"time"
)

// BenchmarkNextFire is one firing of an every-minute schedule in a zone
// with daylight saving.
func BenchmarkNextFire(b *testing.B) {
	cal := compileOK(b, Window{Kind: Deny, Schedule: "* * * * *", Duration: time.Minute, TimeZone: "Europe/Berlin"})
	w := cal.windows[0]
	t := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	for b.Loop() {
		t = nextFire(w.schedule, w.loc, t)
	}
}

// BenchmarkAtWeekly is a typical policy: a weekend freeze, office hours,
// and a one-off freeze.
func BenchmarkAtWeekly(b *testing.B) {
	cal := compileOK(b,
		Window{Kind: Deny, Schedule: "0 18 * * FRI", Duration: 62 * time.Hour, TimeZone: "Europe/Berlin"},
		Window{Kind: Allow, Schedule: "0 8 * * MON-FRI", Duration: 10 * time.Hour, TimeZone: "Europe/Berlin"},
		Window{Kind: Deny, Start: time.Date(2026, 12, 23, 0, 0, 0, 0, time.UTC), End: time.Date(2027, 1, 4, 0, 0, 0, 0, time.UTC)},
	)
	t := time.Date(2026, 6, 3, 12, 0, 0, 0, time.UTC)
	for b.Loop() {
		cal.At(t)
	}
}

// BenchmarkAtBudget is the worst case: the search runs out of its budget.
func BenchmarkAtBudget(b *testing.B) {
	cal := compileOK(b, Window{Kind: Deny, Schedule: "* * * * *", Duration: time.Minute, TimeZone: "Europe/Berlin"})
	t := time.Date(2026, 6, 3, 12, 0, 0, 0, time.UTC)
	for b.Loop() {
		cal.At(t)
	}
}
