package main

// Unit tests of what status prints, over summaries built from objects.

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/pkg/lock"
)

var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// exampleLocks are a Queue lock with a holder and two queued lines, a
// NewestWins lock with one waiting claim, and a free lock of another
// namespace whose policies could not be read.
func exampleLocks() []lock.Summary {
	claim := func(ns, name, target string, build int64, phase buildlockv1.Phase, token int64, age, queued time.Duration) buildlockv1.BuildLock {
		bl := buildlockv1.BuildLock{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, CreationTimestamp: metav1.NewTime(now.Add(-age))},
			Spec:       buildlockv1.BuildLockSpec{Target: target, Repo: "acme/" + strings.Split(name, "-")[0], Branch: "main", Build: build},
			Status:     buildlockv1.BuildLockStatus{Phase: phase, FencingToken: token, Message: "msg of " + name},
		}
		if phase == buildlockv1.PhaseHeld {
			at := metav1.NewMicroTime(now.Add(-age))
			bl.Status.AcquiredAt = &at
		}
		if queued != 0 {
			at := metav1.NewMicroTime(now.Add(-queued))
			bl.Status.QueuedAt = &at
		}
		return bl
	}
	locks := lock.Summarize([]buildlockv1.BuildLock{
		claim("ci", "shop-41", "staging", 41, buildlockv1.PhaseHeld, 7, 3*time.Minute, 0),
		claim("ci", "web-7", "staging", 7, buildlockv1.PhaseWaiting, 0, 2*time.Minute, time.Minute),
		claim("ci", "api-3", "staging", 3, buildlockv1.PhaseWaiting, 0, 5*time.Minute, 2*time.Minute),
		claim("ci", "cli-9", "prod", 9, buildlockv1.PhaseWaiting, 0, 10*time.Second, 0),
		claim("apps", "x-1", "staging", 1, buildlockv1.PhaseReleased, 1, 2*time.Hour, 0),
	}, []buildlockv1.BuildLockPolicy{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "staging"},
		Spec:       buildlockv1.BuildLockPolicySpec{Ordering: buildlockv1.OrderingQueue},
	}})
	locks[0].Ordering = ""
	return locks
}

func TestTheTableShowsHoldersAndQueuesInOrder(t *testing.T) {
	var out bytes.Buffer
	if err := printTable(&out, exampleLocks(), true, false, now); err != nil {
		t.Fatal(err)
	}
	// Ages read as kubectl's; a holder's is how long it holds, a waiter's
	// how long it is queued (else since its creation).
	want := `NAMESPACE   TARGET    ORDERING     PLACE      BUILD                PHASE     TOKEN   AGE
apps        staging   <unknown>    -          <none>                                 
ci          prod      NewestWins   1 (next)   acme/cli@main #9     Waiting           10s
ci          staging   Queue        holder     acme/shop@main #41   Held      7       3m
ci          staging   Queue        1 (next)   acme/api@main #3     Waiting           2m
ci          staging   Queue        2          acme/web@main #7     Waiting           60s
`
	if out.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", out.String(), want)
	}

	out.Reset()
	if err := printTable(&out, exampleLocks()[2:], false, true, now); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if !strings.HasPrefix(lines[0], "TARGET") || !strings.HasSuffix(lines[0], "NAME      POD   MESSAGE") ||
		!strings.Contains(lines[2], "api-3") || !strings.HasSuffix(lines[2], "msg of api-3") {
		t.Errorf("wide table of one namespace:\n%s", out.String())
	}
}

func TestStatusOutputFormats(t *testing.T) {
	locks := exampleLocks()
	render := func(format string) string {
		t.Helper()
		p := genericclioptions.NewPrintFlags("")
		p.OutputFormat = &format
		printer, err := printerFor(p, "wide")
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if format == "name" {
			for _, bl := range holdersAndQueues(locks) {
				must(t, printer.PrintObj(bl, &out))
			}
		} else {
			must(t, printer.PrintObj(&lockStatusList{TypeMeta: lockStatusListType, Items: locks}, &out))
		}
		return out.String()
	}

	var list struct {
		Kind  string
		Items []lock.Summary
	}
	must(t, json.Unmarshal([]byte(render("json")), &list))
	staging := list.Items[2]
	if list.Kind != "LockStatusList" || staging.Ordering != buildlockv1.OrderingQueue || staging.Holder.FencingToken != 7 ||
		len(staging.Queue) != 2 || staging.Queue[0].Name != "api-3" || staging.Queue[1].Position != 2 {
		t.Errorf("-o json: %+v", list)
	}
	if got := render("jsonpath={.items[2].queue[0].name} {.items[2].holder.fencingToken}"); got != "api-3 7" {
		t.Errorf("-o jsonpath = %q", got)
	}
	if got := render("go-template={{range .items}}{{.target}}={{.ordering}} {{end}}"); got != "staging=<no value> prod=NewestWins staging=Queue " {
		t.Errorf("-o go-template = %q", got)
	}
	if got := render("name"); got != "buildlock.buildlock.io/cli-9\nbuildlock.buildlock.io/shop-41\nbuildlock.buildlock.io/api-3\nbuildlock.buildlock.io/web-7\n" {
		t.Errorf("-o name =\n%s", got)
	}
	if got := render("yaml"); !strings.Contains(got, "kind: LockStatusList") || !strings.Contains(got, "position: 2") {
		t.Errorf("-o yaml =\n%s", got)
	}
}

// TestPhaseLineSaysThePhaseOnce: acquire's progress line names the phase
// once, whether or not the operator's message starts with it.
func TestPhaseLineSaysThePhaseOnce(t *testing.T) {
	for _, tc := range []struct {
		phase         buildlockv1.Phase
		message, want string
	}{
		{buildlockv1.PhaseWaiting, "Waiting for build 42 of acme/shop@main to release staging.", "Waiting for build 42 of acme/shop@main to release staging."},
		{buildlockv1.PhaseWaiting, "staging is frozen until 2026-12-02T01:36:04Z (incident 4711); this build keeps its place",
			"Waiting: staging is frozen until 2026-12-02T01:36:04Z (incident 4711); this build keeps its place"},
		{buildlockv1.PhasePending, "", "Pending"},
		{buildlockv1.PhaseWaiting, "Waitingroom is full.", "Waiting: Waitingroom is full."},
	} {
		if got := phaseLine(tc.phase, tc.message); got != tc.want {
			t.Errorf("phaseLine(%s, %q) = %q, want %q", tc.phase, tc.message, got, tc.want)
		}
	}
}
