package policy

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
	"github.com/buildlock/buildlock/internal/window"
)

// Windows is a policy's spec.windows, compiled (package window): what the
// lock reconciler and this controller ask at each instant.
type Windows struct {
	spec     []buildlockv1.Window
	calendar *window.Calendar
	// invalid says a window cannot be evaluated: the target is frozen until
	// the policy is fixed.
	invalid bool
}

// compiledWindows holds each policy's windows as last compiled, by the
// policy's namespace and name: both controllers read a lock's policy on
// every reconcile, and its windows change only with its generation. One
// entry per policy name seen (a deleted policy's stays, and is replaced if
// the name comes back).
var compiledWindows sync.Map

// compiledEntry is one policy generation's windows.
type compiledEntry struct {
	uid        types.UID
	generation int64
	windows    *Windows
	err        error
}

// windowsOf is obj's windows, compiled once per generation (compileWindows).
func windowsOf(obj *buildlockv1.BuildLockPolicy) (*Windows, error) {
	key := types.NamespacedName{Namespace: obj.Namespace, Name: obj.Name}
	if e, ok := compiledWindows.Load(key); ok {
		if e := e.(compiledEntry); e.uid == obj.UID && e.generation == obj.Generation && obj.Generation != 0 {
			return e.windows, e.err
		}
	}
	w, err := compileWindows(obj.Spec.Windows)
	compiledWindows.Store(key, compiledEntry{uid: obj.UID, generation: obj.Generation, windows: w, err: err})
	return w, err
}

// compileWindows compiles the policy's windows; nil when it has none. The
// error names every window that cannot be evaluated.
func compileWindows(spec []buildlockv1.Window) (*Windows, error) {
	if len(spec) == 0 {
		return nil, nil
	}
	cal, err := window.Compile(window.FromPolicy(spec))
	w := &Windows{spec: spec, calendar: cal, invalid: err != nil}
	if err == nil {
		return w, nil
	}
	var names []string
	var we *window.Error
	for _, e := range unjoin(err) {
		if errors.As(e, &we) {
			names = append(names, fmt.Sprintf("window %s: %v", window.Name(spec, we.Window), we.Err))
		}
	}
	return w, errors.New(strings.Join(names, "; "))
}

// unjoin lists the errors err joins (err itself if it joins none).
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// At is the state of the windows at now (an always-open state for w nil),
// and the freeze it means for the arbiter.
func (w *Windows) At(now time.Time) (window.State, arbiter.Freeze) {
	if w == nil {
		return window.State{Open: true}, arbiter.Freeze{}
	}
	s := w.calendar.At(now)
	if s.Open {
		return s, arbiter.Freeze{}
	}
	f := arbiter.Freeze{Frozen: true, Invalid: w.invalid}
	loc := time.UTC
	if len(s.Active) > 0 && s.Active[0].Kind == window.Deny {
		i := s.Active[0].Window
		f.Window, f.Reason, loc = window.Name(w.spec, i), w.spec[i].Reason, w.calendar.Location(i)
	} else if i := w.firstAllow(); i >= 0 {
		loc = w.calendar.Location(i)
	}
	if s.Changes {
		f.Until = s.Next.In(loc)
	}
	for _, a := range s.Active {
		if a.Kind == window.Deny && w.spec[a.Window].Holder == buildlockv1.WindowHolderRelease && a.Start.After(f.ReleaseSince) {
			f.ReleaseSince, f.ReleaseWindow = a.Start.In(w.calendar.Location(a.Window)), window.Name(w.spec, a.Window)
		}
	}
	return s, f
}

// firstAllow is the index of the first Allow window, -1 if none.
func (w *Windows) firstAllow() int {
	for i, spec := range w.spec {
		if spec.Kind == buildlockv1.WindowAllow {
			return i
		}
	}
	return -1
}

// Edge is when the state of w, at now, may change next: zero for w nil.
func (w *Windows) Edge(s window.State) time.Time {
	if w == nil {
		return time.Time{}
	}
	return s.Next
}

// status is what the policy's status shows of s: state, activeWindows,
// nextChange.
func (w *Windows) status(s window.State) (buildlockv1.WindowState, []buildlockv1.ActiveWindow, *metav1.Time) {
	if w == nil {
		return buildlockv1.WindowStateOpen, nil, nil
	}
	return window.PolicyStatus(w.spec, s)
}
