package policy

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

func TestWindowsAt(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 24, 12, 0, 0, 0, time.UTC)
	oneOff := func(kind buildlockv1.WindowKind, name, reason string, start, end time.Time) buildlockv1.Window {
		return buildlockv1.Window{Kind: kind, Name: name, Reason: reason, Start: buildlockv1.NewTimestamp(start), End: buildlockv1.NewTimestamp(end),
			TimeZone: "Europe/Berlin"}
	}
	holiday := oneOff(buildlockv1.WindowDeny, "holiday", "holiday freeze", now.Add(-time.Hour), time.Date(2026, 12, 28, 7, 0, 0, 0, time.UTC))
	incident := oneOff(buildlockv1.WindowDeny, "incident", "", now.Add(-time.Minute), now.Add(time.Hour))
	incident.Holder = buildlockv1.WindowHolderRelease
	for name, tc := range map[string]struct {
		windows []buildlockv1.Window
		want    arbiter.Freeze
	}{
		"no windows: open": {},
		"a Deny window in effect: until its end, in its zone, with its reason": {
			windows: []buildlockv1.Window{holiday},
			want:    arbiter.Freeze{Frozen: true, Until: time.Date(2026, 12, 28, 8, 0, 0, 0, berlin), Window: "holiday", Reason: "holiday freeze"},
		},
		"holder: Release says since when": {
			windows: []buildlockv1.Window{holiday, incident},
			want: arbiter.Freeze{Frozen: true, Until: time.Date(2026, 12, 28, 8, 0, 0, 0, berlin), Window: "holiday", Reason: "holiday freeze",
				ReleaseSince: now.Add(-time.Minute).In(berlin), ReleaseWindow: "incident"},
		},
		"outside every Allow window: frozen until the next one opens": {
			windows: []buildlockv1.Window{oneOff(buildlockv1.WindowAllow, "", "", now.Add(time.Hour), now.Add(2*time.Hour))},
			want:    arbiter.Freeze{Frozen: true, Until: now.Add(time.Hour).In(berlin)},
		},
		"inside an Allow window: open": {
			windows: []buildlockv1.Window{oneOff(buildlockv1.WindowAllow, "", "", now.Add(-time.Hour), now.Add(time.Hour))},
		},
		"a window that cannot be evaluated freezes the target": {
			windows: []buildlockv1.Window{{Kind: buildlockv1.WindowDeny, Schedule: "0 0 30 2 *", Duration: &metav1.Duration{Duration: time.Hour}}},
			want:    arbiter.Freeze{Frozen: true, Invalid: true},
		},
	} {
		t.Run(name, func(t *testing.T) {
			p := &buildlockv1.BuildLockPolicy{ObjectMeta: metav1.ObjectMeta{Name: "staging"}}
			p.Spec.Windows = tc.windows
			applied := For(p, arbiter.Lock{Namespace: "ci", Target: "staging"}, arbiter.Policy{})
			_, got := applied.Windows.At(now)
			if got.Frozen != tc.want.Frozen || !got.Until.Equal(tc.want.Until) || got.Until.Location().String() != tc.want.Until.Location().String() ||
				got.Window != tc.want.Window || got.Reason != tc.want.Reason || got.Invalid != tc.want.Invalid ||
				!got.ReleaseSince.Equal(tc.want.ReleaseSince) || got.ReleaseWindow != tc.want.ReleaseWindow {
				t.Errorf("freeze %+v, want %+v", got, tc.want)
			}
			if tc.want.Invalid && (applied.Ready.Reason != buildlockv1.ReasonInvalidPolicy || !strings.Contains(applied.Ready.Message, "window windows[0]")) {
				t.Errorf("Ready %+v, want InvalidPolicy naming the window", applied.Ready)
			}
		})
	}
}
