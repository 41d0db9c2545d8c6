package crd_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1alpha1 "github.com/buildlock/buildlock/api/v1alpha1"
	windowcal "github.com/buildlock/buildlock/internal/window"
)

// CEL messages of spec.windows, from api/v1alpha1/window_types.go.
const (
	msgScheduleShape  = "a schedule is a cron expression of five fields separated by spaces"
	msgMinute         = "the minute (first field) of a schedule must be"
	msgHour           = "the hour (second field) of a schedule must be"
	msgDayOfMonth     = "the day of month (third field) of a schedule must be"
	msgMonth          = "the month (fourth field) of a schedule must be"
	msgDayOfWeek      = "the day of week (fifth field) of a schedule must be"
	msgRangeUpwards   = "a range in a schedule must go upwards"
	msgZoneShape      = "a timeZone is an IANA time-zone name such as Europe/Berlin"
	msgZoneUnknown    = "this timeZone is not in the time-zone database"
	msgWindowDuration = "a window's duration must be a duration between 1m and 8784h (366 days), for example 62h"
	msgRecurringPair  = "a recurring window needs both schedule and duration"
	msgOneOffPair     = "a one-off window needs both start and end"
	msgOneForm        = "a window is either recurring (schedule and duration) or one-off (start and end): set exactly one of the two pairs"
	msgEndAfterStart  = "a window's end must be after its start"
	msgHolderDeny     = "holder: Release applies only to Deny windows"
	msgFrozenBy       = "frozenBy marks an ad-hoc freeze"
	msgUniqueNames    = "the names of spec.windows must be unique"
	msgWindowReason   = "a window reason must not contain invisible, bidirectional or control characters"
)

// weekend is a valid recurring Deny window.
func weekend() map[string]any {
	return map[string]any{"name": "weekend", "kind": "Deny", "schedule": "0 18 * * FRI", "duration": "62h",
		"timeZone": "Europe/Berlin", "reason": "weekend freeze"}
}

// holiday is a valid one-off Deny window.
func holiday() map[string]any {
	return map[string]any{"name": "holiday", "kind": "Deny", "start": "2026-12-24T00:00:00+01:00",
		"end": "2026-12-28T08:00:00+01:00", "timeZone": "Europe/Berlin", "reason": "holiday freeze"}
}

// window sets spec.windows to the one window that change makes of base.
func window(base func() map[string]any, change func(w map[string]any)) mutation {
	return func(u *unstructured.Unstructured) {
		w := base()
		change(w)
		set("spec.windows", []any{w})(u)
	}
}

// with sets a window's field; without removes it.
func with(field string, value any) func(map[string]any) {
	return func(w map[string]any) { w[field] = value }
}

func without(fields ...string) func(map[string]any) {
	return func(w map[string]any) {
		for _, f := range fields {
			delete(w, f)
		}
	}
}

// schedule is a weekend window with another schedule.
func schedule(s string) mutation { return window(weekend, with("schedule", s)) }

// zone is a weekend window in another time zone.
func zone(z string) mutation { return window(weekend, with("timeZone", z)) }

var _ = Describe("BuildLockPolicy windows", Label("validation"), func() {
	var namespace string

	BeforeEach(func() {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "windows-"}}
		Expect(k8sClient.Create(ctx, ns)).To(Succeed())
		namespace = ns.Name
	})

	create := func(m mutation) error {
		u := validPolicy(namespace)
		m(u)
		return k8sClient.Create(ctx, u)
	}

	DescribeTable("refuses a window that cannot work, saying what to fix",
		func(m mutation, wants ...string) {
			err := create(m)
			GinkgoWriter.Printf("Rejected: %v\n", err)
			Expect(err).To(beInvalid(wants...))
		},
		// The schedule: five fields, each within its bounds.
		Entry("with a schedule of four fields", schedule("0 18 * *"), "spec.windows[0].schedule", msgScheduleShape),
		Entry("with a schedule of six fields (seconds)", schedule("0 0 18 * * FRI"), msgScheduleShape),
		Entry("with a descriptor", schedule("@weekly"), msgScheduleShape),
		Entry("with a CRON_TZ prefix", schedule("CRON_TZ=Europe/Berlin 0 18 * * FRI"), msgScheduleShape),
		Entry("with a schedule that is prose", schedule("every friday evening"), msgScheduleShape),
		Entry("with an empty schedule", schedule(""), msgScheduleShape),
		Entry("with a tab between fields", schedule("0\t18 * * FRI"), msgScheduleShape),
		Entry("with minute 60", schedule("60 18 * * FRI"), msgMinute),
		Entry("with a negative minute", schedule("-1 18 * * FRI"), msgMinute),
		Entry("with a step of zero", schedule("*/0 18 * * FRI"), msgMinute),
		Entry("with a minute step without a start", schedule("/5 18 * * FRI"), msgMinute),
		Entry("with hour 24", schedule("0 24 * * FRI"), msgHour),
		Entry("with a named hour", schedule("0 six * * FRI"), msgHour),
		Entry("with day of month 0", schedule("0 18 0 * *"), msgDayOfMonth),
		Entry("with day of month 32", schedule("0 18 32 * *"), msgDayOfMonth),
		Entry("with a Quartz day of month (L)", schedule("0 18 L * *"), msgDayOfMonth),
		Entry("with a question mark", schedule("0 18 ? * FRI"), msgDayOfMonth),
		Entry("with month 13", schedule("0 18 * 13 *"), msgMonth),
		Entry("with an unknown month name", schedule("0 18 * JANUARY *"), msgMonth),
		Entry("with day of week 7", schedule("0 18 * * 7"), msgDayOfWeek),
		Entry("with an unknown day name", schedule("0 18 * * FRIDAY"), msgDayOfWeek),
		Entry("with a Quartz day of week (5#3)", schedule("0 18 * * 5#3"), msgDayOfWeek),
		Entry("with a downward range of days", schedule("0 18 * * FRI-MON"), msgRangeUpwards),
		Entry("with a downward range of hours", schedule("0 22-6 * * *"), msgRangeUpwards),
		Entry("with a downward range in a list", schedule("0,59-30 18 * * *"), msgRangeUpwards),
		Entry("with a downward range of months", schedule("0 0 1 DEC-jan *"), msgRangeUpwards),

		// The time zone: an IANA name the API server's zone database knows.
		Entry("with an unknown time zone", zone("Europe/Berln"), "spec.windows[0].timeZone", msgZoneUnknown),
		Entry("with a time zone in the wrong case", zone("europe/berlin"), msgZoneUnknown),
		Entry("with a made-up time zone", zone("Mars/Olympus_Mons"), msgZoneUnknown),
		Entry("with an offset for a time zone", zone("+01:00"), msgZoneShape),
		Entry("with CET+1", zone("UTC+01:00"), msgZoneShape),
		Entry("with Local", zone("Local"), msgZoneShape),
		Entry("with a path", zone("../../etc/passwd"), msgZoneShape),
		Entry("with a posix/ zone", zone("posix/Europe/Berlin"), msgZoneShape),
		Entry("with an empty time zone", zone(""), "spec.windows[0].timeZone"),

		// The duration: positive, at most a leap year.
		Entry("with a zero duration", window(weekend, with("duration", "0s")), "spec.windows[0].duration", msgWindowDuration),
		Entry("with a negative duration", window(weekend, with("duration", "-1h")), msgWindowDuration),
		Entry("with a duration under a minute", window(weekend, with("duration", "59s")), msgWindowDuration),
		Entry("with a duration over 366 days", window(weekend, with("duration", "8785h")), msgWindowDuration),
		Entry("with a duration in days", window(weekend, with("duration", "2d")), msgWindowDuration),
		Entry("with a duration that overflows", window(weekend, with("duration", "9999999999h")), msgWindowDuration),

		// One form: recurring or one-off.
		Entry("with a schedule and no duration", window(weekend, without("duration")), msgRecurringPair),
		Entry("with a duration and no schedule", window(weekend, without("schedule")), msgRecurringPair, msgOneForm),
		Entry("with a start and no end", window(holiday, without("end")), msgOneOffPair),
		Entry("with an end and no start", window(holiday, without("start")), msgOneOffPair, msgOneForm),
		Entry("with both forms", window(weekend, func(w map[string]any) {
			w["start"], w["end"] = "2026-12-24T00:00:00Z", "2026-12-28T00:00:00Z"
		}), msgOneForm),
		Entry("with neither form", window(weekend, without("schedule", "duration")), msgOneForm),

		// A one-off window's times.
		Entry("with an end before its start", window(holiday, with("end", "2026-12-23T00:00:00+01:00")), "spec.windows[0]", msgEndAfterStart),
		Entry("with an end equal to its start", window(holiday, with("end", "2026-12-23T23:00:00Z")), msgEndAfterStart),
		Entry("with an end before its start in another offset", window(holiday, func(w map[string]any) {
			w["start"], w["end"] = "2026-12-24T00:30:00+01:00", "2026-12-23T23:15:00Z"
		}), msgEndAfterStart),
		Entry("with a start that is no RFC 3339 time", window(holiday, with("start", "24.12.2026")), "spec.windows[0].start", msgTime),
		Entry("with a start without an offset", window(holiday, with("start", "2026-12-24T00:00:00")), msgTime),

		// The other fields.
		Entry("without a kind", window(weekend, without("kind")), "spec.windows[0].kind: Required value"),
		Entry("with an unknown kind", window(weekend, with("kind", "Block")), "spec.windows[0].kind", "Unsupported value", "Deny", "Allow"),
		Entry("with a lower-case kind", window(weekend, with("kind", "deny")), "spec.windows[0].kind", "Unsupported value"),
		Entry("with an unknown holder", window(weekend, with("holder", "Evict")), "spec.windows[0].holder", "Unsupported value", "Keep", "Release"),
		Entry("with holder Release on an Allow window", window(weekend, func(w map[string]any) {
			w["kind"], w["holder"] = "Allow", "Release"
		}), msgHolderDeny),
		Entry("with frozenBy on a recurring window", window(weekend, with("frozenBy", "alice")), msgFrozenBy),
		Entry("with frozenBy on an Allow window", window(holiday, func(w map[string]any) {
			w["kind"], w["frozenBy"] = "Allow", "alice"
		}), msgFrozenBy),
		Entry("with a reason with a newline", window(weekend, with("reason", "freeze\nkubectl delete ns prod")), msgWindowReason),
		Entry("with a reason of 257 characters", window(weekend, with("reason", strings.Repeat("r", 257))), "spec.windows[0].reason", "Too long"),
		Entry("with a name that is no DNS label", window(weekend, with("name", "Weekend Freeze")), "spec.windows[0].name", "must be a DNS-1123 label"),
		Entry("with two windows of one name", set("spec.windows", []any{weekend(), func() map[string]any {
			w := holiday()
			w["name"] = "weekend"
			return w
		}()}), "spec.windows", msgUniqueNames),
		Entry("with 33 windows", func(u *unstructured.Unstructured) {
			ws := make([]any, 33)
			for i := range ws {
				w := holiday()
				w["name"] = fmt.Sprintf("w%d", i)
				ws[i] = w
			}
			set("spec.windows", ws)(u)
		}, "spec.windows", "Too many"),
	)

	DescribeTable("admits every valid form",
		func(m mutation) {
			Expect(create(m)).To(Succeed())
		},
		Entry("a weekend freeze", window(weekend, func(map[string]any) {})),
		Entry("a holiday freeze", window(holiday, func(map[string]any) {})),
		Entry("an Allow window without a name, zone or reason", set("spec.windows", []any{map[string]any{
			"kind": "Allow", "schedule": "0 8 * * MON-FRI", "duration": "10h"}})),
		Entry("every field form in one schedule", schedule("0,15,30-45/5 */2 1-7,15 JAN-mar,6,Oct mon-fri")),
		Entry("steps from a value (n/s)", schedule("5/15 0/6 1/10 1/3 1/2")),
		Entry("leading zeros", schedule("05 08 01 01 0")),
		Entry("several spaces between fields", schedule("0  18 *   * FRI")),
		Entry("a schedule that never fires (30 February; the operator reports it)", schedule("0 0 30 2 *")),
		Entry("an upward range of equal ends", schedule("0 18 * * 5-5")),
		Entry("a zone with underscores", zone("America/Los_Angeles")),
		Entry("a zone of three parts", zone("America/Argentina/Buenos_Aires")),
		Entry("a zone with a sign", zone("Etc/GMT+5")),
		Entry("UTC", zone("UTC")),
		Entry("a duration of a minute", window(weekend, with("duration", "1m"))),
		Entry("a duration of 366 days", window(weekend, with("duration", "8784h"))),
		Entry("a one-off window in UTC with a fraction", window(holiday, func(w map[string]any) {
			w["start"], w["end"] = "2026-12-23T23:00:00.5Z", "2026-12-23T23:00:00.6Z"
		})),
		Entry("an ad-hoc freeze with holder Release", window(holiday, func(w map[string]any) {
			w["frozenBy"], w["holder"] = "alice@example.com", "Release"
		})),
		Entry("32 windows, unnamed ones among them", func(u *unstructured.Unstructured) {
			ws := make([]any, 32)
			for i := range ws {
				w := weekend()
				if i%2 == 0 {
					delete(w, "name")
				} else {
					w["name"] = fmt.Sprintf("w%d", i)
				}
				ws[i] = w
			}
			set("spec.windows", ws)(u)
		}),
	)

	It("decodes every field of an admitted window and status", func() {
		w := holiday()
		w["frozenBy"], w["holder"] = "alice@example.com", "Release"
		Expect(create(set("spec.windows", []any{weekend(), w}))).To(Succeed())
		var p buildlockv1alpha1.BuildLockPolicy
		key := client.ObjectKey{Namespace: namespace, Name: "staging"}
		Expect(k8sClient.Get(ctx, key, &p)).To(Succeed())
		Expect(p.Spec.Windows).To(HaveLen(2))
		Expect(p.Spec.Windows[0]).To(Equal(buildlockv1alpha1.Window{
			Name: "weekend", Kind: buildlockv1alpha1.WindowDeny, Schedule: "0 18 * * FRI",
			Duration: &metav1.Duration{Duration: 62 * time.Hour}, TimeZone: "Europe/Berlin", Reason: "weekend freeze",
		}))
		one := p.Spec.Windows[1]
		Expect(one.Start.Equal(time.Date(2026, 12, 23, 23, 0, 0, 0, time.UTC))).To(BeTrue())
		Expect(one.End.Equal(time.Date(2026, 12, 28, 7, 0, 0, 0, time.UTC))).To(BeTrue())
		Expect(one.Holder).To(Equal(buildlockv1alpha1.WindowHolderRelease))
		Expect(one.FrozenBy).To(Equal("alice@example.com"))

		// The status the operator writes is admitted and reads back.
		end := metav1.NewTime(time.Date(2026, 12, 28, 7, 0, 0, 0, time.UTC))
		p.Status = buildlockv1alpha1.BuildLockPolicyStatus{
			State: buildlockv1alpha1.WindowStateFrozen,
			ActiveWindows: []buildlockv1alpha1.ActiveWindow{{Index: 1, Name: "holiday", Kind: buildlockv1alpha1.WindowDeny,
				Reason: "holiday freeze", FrozenBy: "alice@example.com", Start: metav1.NewTime(one.Start.Time), End: &end}},
			NextChange: &end,
		}
		Expect(k8sClient.Status().Update(ctx, &p)).To(Succeed())
		var back buildlockv1alpha1.BuildLockPolicy
		Expect(k8sClient.Get(ctx, key, &back)).To(Succeed())
		Expect(back.Status.State).To(Equal(buildlockv1alpha1.WindowStateFrozen))
		Expect(back.Status.ActiveWindows).To(HaveLen(1))
		Expect(back.Status.ActiveWindows[0].Reason).To(Equal("holiday freeze"))
		Expect(back.Status.NextChange.Equal(&end)).To(BeTrue())

		// kubectl get blp prints the state, the next change and the first
		// active window's reason; -o wide its name too.
		httpClient, err := rest.HTTPClientFor(testEnv.Config)
		Expect(err).NotTo(HaveOccurred())
		req, err := http.NewRequestWithContext(ctx, http.MethodGet,
			strings.TrimSuffix(testEnv.Config.Host, "/")+"/apis/buildlock.io/v1alpha1/namespaces/"+namespace+"/buildlockpolicies/staging", nil)
		Expect(err).NotTo(HaveOccurred())
		req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
		resp, err := httpClient.Do(req)
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.StatusCode).To(Equal(http.StatusOK), "%s %s", req.URL, body)
		var table metav1.Table
		Expect(json.Unmarshal(body, &table)).To(Succeed())
		Expect(table.Rows).To(HaveLen(1))
		cells := map[string]any{}
		for i, c := range table.ColumnDefinitions {
			if c.Priority == 0 || c.Name == "Window" {
				cells[c.Name] = table.Rows[0].Cells[i]
			}
		}
		Expect(cells).To(HaveKeyWithValue("State", "Frozen"))
		Expect(cells).To(HaveKeyWithValue("Next Change", "2026-12-28T07:00:00Z"))
		Expect(cells).To(HaveKeyWithValue("Reason", "holiday freeze"))
		Expect(cells).To(HaveKeyWithValue("Window", "holiday"))
	})
})

// The operator (internal/window) and the API server must agree on every
// schedule and time zone: what admission refuses the operator refuses too,
// and what admission admits the operator evaluates, but for the schedules
// that name no date that exists, which only the operator can tell.
var _ = Describe("Window admission and the operator", Label("validation"), func() {
	var namespace string

	BeforeEach(func() {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "agree-"}}
		Expect(k8sClient.Create(ctx, ns)).To(Succeed())
		namespace = ns.Name
	})

	It("agree on every schedule and zone", func() {
		schedules := []string{
			"0 18 * * FRI", "*/15 * * * *", "0 8-18 * * MON-FRI", "5/15 0/6 1/10 1/3 1/2", "0,30 1-3,22-23 * JAN-MAR,OCT-DEC sun,sat",
			"0 0 1 1 *", "59 23 31 12 *", "0 0 29 2 *", "00 00 01 01 0", "0  18 *  * FRI", "0 0 * * 6-6",
			"0 0 30 2 *", "0 0 31 4,6,9,11 *",
			"60 * * * *", "0 24 * * *", "0 0 0 * *", "0 0 32 * *", "0 0 * 0 *", "0 0 * 13 *", "0 0 * * 7", "* * * *", "* * * * * *",
			"@daily", "@every 1h", "CRON_TZ=UTC 0 0 * * *", "TZ=UTC", "0 0 ? * *", "0 0 L * *", "0 0 * * 5#3", "0 0 * * 5L",
			"*/0 * * * *", "*/100 * * * *", "5-1 * * * *", "0 0 * DEC-JAN *", "0 0 * * FRI-MON", "1-2-3 * * * *", "1/2/3 * * * *",
			"*-5 * * * *", "+5 * * * *", " 0 0 * * *", "0 0 * * * ", "0\t0 * * *", "0 0 * * MONDAY", "0 0 * JANUARY *", "a b c d e",
			"0 0 1,,2 * *", "0 0 1, * *", ",1 0 * * *", "0 0 * * 1-", "0 0 * * -1",
		}
		zones := []string{"UTC", "Europe/Berlin", "America/Argentina/Buenos_Aires", "Etc/GMT-14", "EST5EDT", "Europe/Kyiv",
			"Europe/Berln", "europe/berlin", "Local", "+01:00", "posix/Europe/Berlin", "Mars/Phobos", "GMT+1", "Europe/Berlin/"}
		for i, s := range schedules {
			w := weekend()
			w["schedule"] = s
			u := validPolicy(namespace)
			u.SetName(fmt.Sprintf("s%d", i))
			set("spec.windows", []any{w})(u)
			admitted := k8sClient.Create(ctx, u) == nil
			_, err := windowcal.Compile([]windowcal.Window{{Kind: windowcal.Deny, Schedule: s, Duration: time.Hour, TimeZone: "Europe/Berlin"}})
			neverFires := err != nil && strings.Contains(err.Error(), "never fires")
			Expect(admitted).To(Equal(err == nil || neverFires), "schedule %q: admitted %v, the operator says %v", s, admitted, err)
		}
		for i, z := range zones {
			w := weekend()
			w["timeZone"] = z
			u := validPolicy(namespace)
			u.SetName(fmt.Sprintf("z%d", i))
			set("spec.windows", []any{w})(u)
			admitted := k8sClient.Create(ctx, u) == nil
			_, err := windowcal.Compile([]windowcal.Window{{Kind: windowcal.Deny, Schedule: "0 0 * * *", Duration: time.Hour, TimeZone: z}})
			Expect(admitted).To(Equal(err == nil), "zone %q: admitted %v, the operator says %v", z, admitted, err)
		}
	})
})
