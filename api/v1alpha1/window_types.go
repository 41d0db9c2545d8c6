package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// WindowKind says what a window does to its target while it is in effect.
// +kubebuilder:validation:Enum=Deny;Allow
type WindowKind string

const (
	// WindowDeny freezes the target while the window is in effect: no claim
	// is granted the lock (but through an override). Deny beats Allow.
	WindowDeny WindowKind = "Deny"
	// WindowAllow opens the target while the window is in effect. A policy
	// with any Allow window keeps its target frozen outside all of them.
	WindowAllow WindowKind = "Allow"
)

// WindowHolder is what a Deny window does to the build that holds the lock
// when the window starts.
// +kubebuilder:validation:Enum=Keep;Release
type WindowHolder string

const (
	// WindowHolderKeep is the default: the holder keeps the lock until its
	// build ends, as always: nobody is pre-empted; the freeze holds back
	// the claims that wait.
	WindowHolderKeep WindowHolder = "Keep"
	// WindowHolderRelease ends the hold of the build that holds when the
	// window starts (phase Released, reason FreezeStarted), so that nothing
	// deploys during the window: for an incident. A claim granted through
	// the freeze by an override keeps its hold.
	WindowHolderRelease WindowHolder = "Release"
)

// CronSchedule is a cron expression of five fields: minute, hour, day of
// month, month and day of week, as crontab(5) and Kubernetes CronJobs
// write them ("0 18 * * FRI"). Each field is *, a number, a range a-b, a
// step */n or a-b/n (or n/s: from n to the end in steps of s), or a
// comma-separated list of them; months and days of the week may be named
// (JAN-DEC, SUN-SAT, any case). Day of month and day of week restrict the
// days together when one of them is *, and either one suffices when
// neither is (as in cron). Seconds, @-names (@daily), CRON_TZ= and ? are
// not accepted: the zone is the window's timeZone.
//
// The API server checks each field's values and that ranges go upwards;
// a schedule that names no date that exists (30 February) is admitted and
// reported by the operator (the policy's Ready condition: InvalidPolicy).
//
// +kubebuilder:validation:MaxLength=100
// +kubebuilder:validation:XValidation:rule=`self.matches(r'^\S+( +\S+){4}$')`,message="a schedule is a cron expression of five fields separated by spaces (minute hour day-of-month month day-of-week), for example '0 18 * * FRI'; seconds, @daily and CRON_TZ= are not accepted (set the window's timeZone)"
// +kubebuilder:validation:XValidation:rule=`!self.matches(r'^\S+( +\S+){4}$') || self.matches(r'^(\*|([0-5]?[0-9])(-([0-5]?[0-9]))?)(/[1-9][0-9]?)?(,(\*|([0-5]?[0-9])(-([0-5]?[0-9]))?)(/[1-9][0-9]?)?)* +\S+ +\S+ +\S+ +\S+$')`,message="the minute (first field) of a schedule must be *, a minute 0-59, a range such as 0-29, a step such as */15 or 0-29/5, or a comma-separated list of them"
// +kubebuilder:validation:XValidation:rule=`!self.matches(r'^\S+( +\S+){4}$') || self.matches(r'^\S+ +(\*|([01]?[0-9]|2[0-3])(-([01]?[0-9]|2[0-3]))?)(/[1-9][0-9]?)?(,(\*|([01]?[0-9]|2[0-3])(-([01]?[0-9]|2[0-3]))?)(/[1-9][0-9]?)?)* +\S+ +\S+ +\S+$')`,message="the hour (second field) of a schedule must be *, an hour 0-23, a range such as 9-17, a step such as */6 or 8-18/2, or a comma-separated list of them"
// +kubebuilder:validation:XValidation:rule=`!self.matches(r'^\S+( +\S+){4}$') || self.matches(r'^\S+ +\S+ +(\*|(0?[1-9]|[12][0-9]|3[01])(-(0?[1-9]|[12][0-9]|3[01]))?)(/[1-9][0-9]?)?(,(\*|(0?[1-9]|[12][0-9]|3[01])(-(0?[1-9]|[12][0-9]|3[01]))?)(/[1-9][0-9]?)?)* +\S+ +\S+$')`,message="the day of month (third field) of a schedule must be *, a day 1-31, a range such as 1-7, a step such as */2, or a comma-separated list of them"
// +kubebuilder:validation:XValidation:rule=`!self.matches(r'^\S+( +\S+){4}$') || self.matches(r'^\S+ +\S+ +\S+ +(\*|(0?[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec))(-(0?[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)))?)(/[1-9][0-9]?)?(,(\*|(0?[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec))(-(0?[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)))?)(/[1-9][0-9]?)?)* +\S+$')`,message="the month (fourth field) of a schedule must be *, a month 1-12 or JAN-DEC, a range such as JUN-AUG, a step such as */3, or a comma-separated list of them"
// +kubebuilder:validation:XValidation:rule=`!self.matches(r'^\S+( +\S+){4}$') || self.matches(r'^\S+ +\S+ +\S+ +\S+ +(\*|([0-6]|(?i:sun|mon|tue|wed|thu|fri|sat))(-([0-6]|(?i:sun|mon|tue|wed|thu|fri|sat)))?)(/[1-9][0-9]?)?(,(\*|([0-6]|(?i:sun|mon|tue|wed|thu|fri|sat))(-([0-6]|(?i:sun|mon|tue|wed|thu|fri|sat)))?)(/[1-9][0-9]?)?)*$')`,message="the day of week (fifth field) of a schedule must be *, a day 0-6 (0 is Sunday) or SUN-SAT, a range such as MON-FRI, or a comma-separated list of them such as SAT,SUN"
// +kubebuilder:validation:XValidation:rule=`self.lowerAscii().findAll(r'([0-9]+|[a-z]+)-([0-9]+|[a-z]+)').all(r, (r.split('-')[0] < 'a' ? int(r.split('-')[0]) : ('sunmontuewedthufrisat'.indexOf(r.split('-')[0]) >= 0 ? 'sunmontuewedthufrisat'.indexOf(r.split('-')[0]) / 3 : '___janfebmaraprmayjunjulaugsepoctnovdec'.indexOf(r.split('-')[0]) / 3)) <= (r.split('-')[1] < 'a' ? int(r.split('-')[1]) : ('sunmontuewedthufrisat'.indexOf(r.split('-')[1]) >= 0 ? 'sunmontuewedthufrisat'.indexOf(r.split('-')[1]) / 3 : '___janfebmaraprmayjunjulaugsepoctnovdec'.indexOf(r.split('-')[1]) / 3)))`,message="a range in a schedule must go upwards, such as 1-5 or MON-FRI; for a range that wraps around, list its parts: FRI-MON is 5-6,0-1"
type CronSchedule string

// TimeZone is an IANA time-zone name, such as Europe/Berlin, America/New_York
// or UTC, as the time-zone database names them (`timedatectl
// list-timezones`). The API server refuses a name its zone database does not
// know; the operator carries its own database, and reports a zone it does
// not know in the policy's Ready condition (InvalidPolicy).
//
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=64
// +kubebuilder:validation:XValidation:rule=`self.matches(r'^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$') && self != 'Local' && !self.startsWith('posix/') && !self.startsWith('right/')`,message="a timeZone is an IANA time-zone name such as Europe/Berlin, America/New_York or UTC (not an offset such as +01:00, and not Local)"
// +kubebuilder:validation:XValidation:rule=`!self.matches(r'^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$') || self == 'Local' || timestamp('2000-01-01T00:00:00Z').getHours(self) >= 0`,message="this timeZone is not in the time-zone database: use an IANA name such as Europe/Berlin, America/New_York or UTC (mind the case and the underscores: America/Los_Angeles)"
type TimeZone string

// Window is a span of time during which a Deny window freezes its target
// or an Allow window opens it: either recurring (schedule and duration:
// from every instant the schedule names, for duration) or one-off (from
// start to end).
//
// A recurring window starts at every instant at which the clocks of its
// time zone show a time the schedule names, and ends when they show that
// time plus duration: from Friday 18:00 for 62h is until Monday 08:00,
// also on the weekends the clocks change. When the clocks go back and show
// a time twice, a window at that time starts twice (the two occurrences
// act as one when they overlap or touch); when they skip forward over a
// time, a window at that time starts at the skip, so that no window is
// lost to daylight saving.
//
// +kubebuilder:validation:XValidation:rule="has(self.schedule) == has(self.duration)",message="a recurring window needs both schedule and duration (for example schedule '0 18 * * FRI' and duration 62h)"
// +kubebuilder:validation:XValidation:rule="has(self.start) == has(self.end)",message="a one-off window needs both start and end (RFC 3339 times such as 2026-12-24T00:00:00+01:00)"
// +kubebuilder:validation:XValidation:rule="has(self.schedule) != has(self.start)",message="a window is either recurring (schedule and duration) or one-off (start and end): set exactly one of the two pairs"
// +kubebuilder:validation:XValidation:rule="!has(self.start) || !has(self.end) || timestamp(self.end) > timestamp(self.start)",message="a window's end must be after its start"
// +kubebuilder:validation:XValidation:rule="!has(self.holder) || self.holder == 'Keep' || self.kind == 'Deny'",message="holder: Release applies only to Deny windows"
// +kubebuilder:validation:XValidation:rule="!has(self.frozenBy) || (self.kind == 'Deny' && has(self.start))",message="frozenBy marks an ad-hoc freeze (kubectl buildlock freeze): only a one-off Deny window (start and end) carries it"
type Window struct {
	// Name identifies the window in messages, the policy's status and
	// `kubectl buildlock unfreeze`: a DNS-1123 label, unique among the
	// policy's windows. Optional; a window without one is named by its
	// position ("windows[2]").
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule=`self.matches(r'^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')`,message="a window's name must be a DNS-1123 label: lower-case letters, digits and '-', starting and ending with a letter or digit, for example weekend-freeze"
	Name string `json:"name,omitempty"`

	// Kind is Deny (the target is frozen while the window is in effect) or
	// Allow (it is open). Deny beats Allow; with any Allow window, the
	// target is frozen outside every Allow window.
	// +required
	Kind WindowKind `json:"kind"`

	// Schedule, for a recurring window, names when it starts: a cron
	// expression of five fields read in timeZone, such as "0 18 * * FRI"
	// (Fridays at 18:00).
	// +optional
	Schedule CronSchedule `json:"schedule,omitempty"`

	// Duration, for a recurring window, is how long each occurrence lasts
	// on the clocks of timeZone: between 1m and 8784h (366 days), for
	// example 62h.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule=`self.matches(r'^([0-9]{1,5}(\.[0-9]{1,9})?(ns|us|ms|s|m|h)){1,4}$') && duration(self) >= duration('1m') && duration(self) <= duration('8784h')`,message="a window's duration must be a duration between 1m and 8784h (366 days), for example 62h"
	Duration *metav1.Duration `json:"duration,omitempty"`

	// Start, for a one-off window, is when it starts: an RFC 3339 time
	// with its offset, such as 2026-12-24T00:00:00+01:00.
	// +optional
	Start *Timestamp `json:"start,omitempty"`

	// End, for a one-off window, is when it ends (the instant itself is
	// outside the window): after start.
	// +optional
	End *Timestamp `json:"end,omitempty"`

	// TimeZone is the IANA time zone the schedule is read in, and the one
	// messages give the window's times in. Absent means UTC.
	// +optional
	TimeZone TimeZone `json:"timeZone,omitempty"`

	// Reason says why the window exists ("holiday freeze", "incident
	// 4711"); messages and the policy's status quote it.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule=`!self.matches(r'[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\x{034F}\x{115F}\x{1160}\x{17B4}\x{17B5}\x{3164}\x{FFA0}]')`,messageExpression=`[self.find(r'[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\x{034F}\x{115F}\x{1160}\x{17B4}\x{17B5}\x{3164}\x{FFA0}]')].map(c, [string(self.indexOf(c) + 1)].map(i, ['%x'.format([bytes(c)])].map(h, [[0, 1, 2, 3].filter(k, 2 * k < size(h)).map(k, '0123456789abcdef'.indexOf(h.charAt(2 * k)) * 16 + '0123456789abcdef'.indexOf(h.charAt(2 * k + 1)))].map(b, [size(b) == 1 ? b[0] : size(b) == 2 ? (b[0] - 192) * 64 + b[1] - 128 : size(b) == 3 ? (b[0] - 224) * 4096 + (b[1] - 128) * 64 + b[2] - 128 : (b[0] - 240) * 262144 + (b[1] - 128) * 4096 + (b[2] - 128) * 64 + b[3] - 128].map(p, 'a window reason must not contain invisible, bidirectional or control characters: it has U+' + (p >= 1048576 ? ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 1048576 % 16] : '') + (p >= 65536 ? ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 65536 % 16] : '') + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 4096 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 256 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 16 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p % 16] + ' at character ' + i + '; write it without that character')[0])[0])[0])[0])[0]`,message="a window reason must not contain invisible, bidirectional or control characters (zero-width spaces, bidirectional marks and overrides, line separators, newlines, tabs)"
	Reason string `json:"reason,omitempty"`

	// Holder says what a Deny window does to the build that holds the lock
	// when it starts: Keep (the default) lets it finish; Release ends its
	// hold at the window's start.
	// +optional
	Holder WindowHolder `json:"holder,omitempty"`

	// FrozenBy marks an ad-hoc freeze, added by `kubectl buildlock freeze`:
	// the user name of whoever added it, as the API server authenticated
	// them (with the identity admission policies installed, the API
	// server refuses a window whose frozenBy is not its sender's own user
	// name). `kubectl buildlock unfreeze` removes ad-hoc freezes only,
	// never the policy's other windows.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule=`!self.matches(r'[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\x{034F}\x{115F}\x{1160}\x{17B4}\x{17B5}\x{3164}\x{FFA0}]')`,messageExpression=`[self.find(r'[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\x{034F}\x{115F}\x{1160}\x{17B4}\x{17B5}\x{3164}\x{FFA0}]')].map(c, [string(self.indexOf(c) + 1)].map(i, ['%x'.format([bytes(c)])].map(h, [[0, 1, 2, 3].filter(k, 2 * k < size(h)).map(k, '0123456789abcdef'.indexOf(h.charAt(2 * k)) * 16 + '0123456789abcdef'.indexOf(h.charAt(2 * k + 1)))].map(b, [size(b) == 1 ? b[0] : size(b) == 2 ? (b[0] - 192) * 64 + b[1] - 128 : size(b) == 3 ? (b[0] - 224) * 4096 + (b[1] - 128) * 64 + b[2] - 128 : (b[0] - 240) * 262144 + (b[1] - 128) * 4096 + (b[2] - 128) * 64 + b[3] - 128].map(p, 'frozenBy must not contain invisible, bidirectional or control characters: it has U+' + (p >= 1048576 ? ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 1048576 % 16] : '') + (p >= 65536 ? ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 65536 % 16] : '') + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 4096 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 256 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p / 16 % 16] + ['0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'A', 'B', 'C', 'D', 'E', 'F'][p % 16] + ' at character ' + i + '; write it without that character')[0])[0])[0])[0])[0]`,message="frozenBy must not contain invisible, bidirectional or control characters (zero-width spaces, bidirectional marks and overrides, line separators, newlines, tabs)"
	FrozenBy string `json:"frozenBy,omitempty"`
}

// WindowState is whether a policy's target takes grants now.
// +kubebuilder:validation:Enum=Open;Frozen
type WindowState string

const (
	// WindowStateOpen means claims on the target are granted as usual.
	WindowStateOpen WindowState = "Open"
	// WindowStateFrozen means no claim is granted (but through an
	// override): a Deny window is in effect, or the policy has Allow
	// windows and none is in effect, or a window cannot be evaluated (the
	// Ready condition says InvalidPolicy and names it).
	WindowStateFrozen WindowState = "Frozen"
)

// ActiveWindow is a window in effect.
type ActiveWindow struct {
	// Index is the window's position in spec.windows.
	Index int32 `json:"index"`

	// Name is the window's name, if it has one.
	// +optional
	Name string `json:"name,omitempty"`

	// Kind is the window's kind.
	Kind WindowKind `json:"kind"`

	// Reason is the window's reason.
	// +optional
	Reason string `json:"reason,omitempty"`

	// FrozenBy is who added the window, for an ad-hoc freeze.
	// +optional
	FrozenBy string `json:"frozenBy,omitempty"`

	// Start is when the window's occurrence in effect began (for a
	// recurring window whose occurrences overlap, the earliest of those in
	// effect).
	Start metav1.Time `json:"start"`

	// End is when it ends; absent when that is beyond the operator's
	// look-ahead (a year).
	// +optional
	End *metav1.Time `json:"end,omitempty"`
}

// Reasons of a claim's status that windows give.
const (
	// ReasonFrozen (phase Waiting) means the claim's target is frozen: the
	// claim keeps its place and is granted, in the order of the policy's
	// ordering, when the target opens. Its message names the window, its
	// reason and when the target opens.
	ReasonFrozen = "Frozen"
	// ReasonFreezeStarted (phase Released) means a Deny window with holder
	// Release started while the claim held the lock.
	ReasonFreezeStarted = "FreezeStarted"
	// ReasonOverridden is the reason of the Event recorded on a claim
	// granted through a freeze by its override; its note names who
	// overrode, why, and the freeze.
	ReasonOverridden = "Overridden"
	// ReasonFreezeBegan and ReasonFreezeEnded are the reasons of the Events
	// recorded on a BuildLockPolicy when its target becomes frozen, and
	// open again.
	ReasonFreezeBegan = "FreezeBegan"
	ReasonFreezeEnded = "FreezeEnded"
)

// Annotations of an override: a person lets one named claim be granted
// through a freeze (`kubectl buildlock override`).
const (
	// OverrideAnnotation, set on a BuildLock to the override's reason, lets
	// that claim be granted while its target is frozen, once, until
	// OverrideExpiresAnnotation. It does not pre-empt a holder: once the
	// lock is free, the first claim whose override is in effect is granted,
	// ahead of the claims the freeze holds back, which keep their places.
	// Service accounts may not set it (the buildlock-override admission
	// policy refuses them); the annotations stay on the claim as the
	// record.
	OverrideAnnotation = "buildlock.io/override"
	// OverrideExpiresAnnotation is when the override lapses unused: an RFC
	// 3339 time. An override without it, with one the operator cannot
	// read, or with one more than MaxOverrideFor ahead, is ignored (the
	// claim's message says why).
	OverrideExpiresAnnotation = "buildlock.io/override-expires"
	// OverriddenByAnnotation names who set or changed OverrideAnnotation or
	// OverrideExpiresAnnotation, as the API server authenticated them: the
	// identity admission policies stamp it on every such request and refuse any
	// other change of it. Without those policies anyone may write it, and
	// the operator calls the override unverified.
	OverriddenByAnnotation = "buildlock.io/overridden-by"
)
