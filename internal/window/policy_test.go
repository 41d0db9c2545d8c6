package window

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// TestFromPolicy evaluates a policy's windows as the API writes them.
func TestFromPolicy(t *testing.T) {
	start, end := rfc(t, "2026-12-24T00:00:00+01:00"), rfc(t, "2026-12-28T08:00:00+01:00")
	spec := []buildlockv1.Window{
		{Name: "weekend", Kind: buildlockv1.WindowDeny, Schedule: "0 18 * * FRI", Duration: &metav1.Duration{Duration: 62 * time.Hour},
			TimeZone: "Europe/Berlin", Reason: "weekend freeze"},
		{Kind: buildlockv1.WindowDeny, Start: buildlockv1.NewTimestamp(start), End: buildlockv1.NewTimestamp(end),
			Reason: "incident 4711", FrozenBy: "alice@example.com"},
		{Name: "office", Kind: buildlockv1.WindowAllow, Schedule: "0 8 * * MON-FRI", Duration: &metav1.Duration{Duration: 10 * time.Hour}},
	}
	ws := FromPolicy(spec)
	want := []Window{
		{Kind: Deny, Schedule: "0 18 * * FRI", Duration: 62 * time.Hour, TimeZone: "Europe/Berlin"},
		{Kind: Deny, Start: start, End: end},
		{Kind: Allow, Schedule: "0 8 * * MON-FRI", Duration: 10 * time.Hour},
	}
	for i := range want {
		if ws[i].Kind != want[i].Kind || ws[i].Schedule != want[i].Schedule || ws[i].Duration != want[i].Duration ||
			!ws[i].Start.Equal(want[i].Start) || !ws[i].End.Equal(want[i].End) || ws[i].TimeZone != want[i].TimeZone {
			t.Errorf("window %d: got %+v, want %+v", i, ws[i], want[i])
		}
	}
	if got := (Name(spec, 0) + " " + Name(spec, 1) + " " + Name(spec, 2) + " " + Name(spec, 7)); got != "weekend windows[1] office windows[7]" {
		t.Errorf("names: %s", got)
	}

	// On Christmas Day the ad-hoc freeze and office hours (in UTC) are in
	// effect; after the freeze, the target opens with the office hours.
	cal := compileOK(t, ws...)
	s := cal.At(rfc(t, "2026-12-25T10:00:00+01:00"))
	state, active, next := PolicyStatus(spec, s)
	if opens := rfc(t, "2026-12-28T08:00:00Z"); state != buildlockv1.WindowStateFrozen || next == nil || !next.Time.Equal(opens) {
		t.Fatalf("got %s until %v, want Frozen until %v", state, next, opens)
	}
	if len(active) != 2 {
		t.Fatalf("active: %+v", active)
	}
	freeze, office := active[0], active[1]
	if freeze.Index != 1 || freeze.Name != "" || freeze.Kind != buildlockv1.WindowDeny || freeze.Reason != "incident 4711" ||
		freeze.FrozenBy != "alice@example.com" || !freeze.Start.Time.Equal(start) || freeze.End == nil || !freeze.End.Time.Equal(end) {
		t.Errorf("the freeze: %+v", freeze)
	}
	if office.Index != 2 || office.Name != "office" || office.Kind != buildlockv1.WindowAllow ||
		!office.Start.Time.Equal(rfc(t, "2026-12-25T08:00:00Z")) || !office.End.Time.Equal(rfc(t, "2026-12-25T18:00:00Z")) {
		t.Errorf("office hours: %+v", office)
	}

	// Without windows: open, nothing in effect, no change.
	state, active, next = PolicyStatus(nil, compileOK(t).At(start))
	if state != buildlockv1.WindowStateOpen || active != nil || next != nil {
		t.Errorf("no windows: got %s, %v, %v", state, active, next)
	}
}
