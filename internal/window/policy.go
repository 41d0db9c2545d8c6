package window

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// FromPolicy is a BuildLockPolicy's spec.windows, for Compile: window i
// of the result is window i of the spec.
func FromPolicy(ws []buildlockv1.Window) []Window {
	out := make([]Window, len(ws))
	for i, w := range ws {
		out[i] = Window{Schedule: string(w.Schedule), TimeZone: string(w.TimeZone)}
		switch w.Kind {
		case buildlockv1.WindowDeny:
			out[i].Kind = Deny
		case buildlockv1.WindowAllow:
			out[i].Kind = Allow
		}
		if w.Duration != nil {
			out[i].Duration = w.Duration.Duration
		}
		if w.Start != nil {
			out[i].Start = w.Start.Time
		}
		if w.End != nil {
			out[i].End = w.End.Time
		}
	}
	return out
}

// Name is how messages and the policy's status name window i of ws: its
// name, or its position.
func Name(ws []buildlockv1.Window, i int) string {
	if i >= 0 && i < len(ws) && ws[i].Name != "" {
		return ws[i].Name
	}
	return fmt.Sprintf("windows[%d]", i)
}

// PolicyStatus is what a policy whose spec.windows are ws shows of s:
// status.state, status.activeWindows and status.nextChange (nil when
// nothing changes within the search).
func PolicyStatus(ws []buildlockv1.Window, s State) (buildlockv1.WindowState, []buildlockv1.ActiveWindow, *metav1.Time) {
	state := buildlockv1.WindowStateFrozen
	if s.Open {
		state = buildlockv1.WindowStateOpen
	}
	var active []buildlockv1.ActiveWindow
	for _, a := range s.Active {
		aw := buildlockv1.ActiveWindow{Index: int32(a.Window), Kind: buildlockv1.WindowAllow, Start: metav1.NewTime(a.Start)}
		if a.Kind == Deny {
			aw.Kind = buildlockv1.WindowDeny
		}
		if a.Window >= 0 && a.Window < len(ws) {
			w := ws[a.Window]
			aw.Name, aw.Reason, aw.FrozenBy = w.Name, w.Reason, w.FrozenBy
		}
		if !a.End.IsZero() {
			end := metav1.NewTime(a.End)
			aw.End = &end
		}
		active = append(active, aw)
	}
	var next *metav1.Time
	if s.Changes {
		t := metav1.NewTime(s.Next)
		next = &t
	}
	return state, active, next
}
