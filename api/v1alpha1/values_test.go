package v1alpha1_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// readVersion returns the v1alpha1 version of a generated CRD.
func readVersion(t *testing.T, file string) apiextensionsv1.CustomResourceDefinitionVersion {
	t.Helper()
	b, err := os.ReadFile("../../config/crd/bases/" + file)
	if err != nil {
		t.Fatalf("reading the generated CRD (run `make manifests`): %v", err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(b, &crd); err != nil {
		t.Fatalf("decoding %s: %v", file, err)
	}
	return crd.Spec.Versions[0]
}

// readSchema returns the v1alpha1 schema of a generated CRD.
func readSchema(t *testing.T, file string) apiextensionsv1.JSONSchemaProps {
	t.Helper()
	return *readVersion(t, file).Schema.OpenAPIV3Schema
}

// rules joins a field's CEL rules, to search them.
func rules(p apiextensionsv1.JSONSchemaProps) string {
	var b strings.Builder
	for _, r := range p.XValidations {
		b.WriteString(r.Rule)
		b.WriteByte('\n')
	}
	return b.String()
}

// TestValuesAreTheCRDs keeps api/v1alpha1's exported values equal to what
// the CRD (generated from the markers, which must repeat them literally)
// enforces, so that every client validating with them agrees with the API
// server.
func TestValuesAreTheCRDs(t *testing.T) {
	spec := readSchema(t, "buildlock.io_buildlocks.yaml").Properties["spec"]
	p := spec.Properties
	check := func(what string, got, want any) {
		t.Helper()
		if got != want {
			t.Errorf("%s: the CRD has %v, api/v1alpha1 says %v", what, got, want)
		}
	}
	check("target pattern", p["target"].Pattern, buildlockv1.TargetPattern)
	check("target maxLength", *p["target"].MaxLength, int64(buildlockv1.MaxTargetLength))
	check("repo pattern", p["repo"].Pattern, buildlockv1.RepoPattern)
	check("repo minLength", *p["repo"].MinLength, int64(buildlockv1.MinRepoLength))
	check("repo maxLength", *p["repo"].MaxLength, int64(buildlockv1.MaxRepoLength))
	check("branch maxLength", *p["branch"].MaxLength, int64(buildlockv1.MaxBranchLength))
	check("branch rule has the forbidden characters", strings.Contains(rules(p["branch"]), "["+buildlockv1.BranchForbiddenChars+"]"), true)
	check("build maximum", int64(*p["build"].Maximum), int64(buildlockv1.MaxBuild))
	pod := p["podRef"].Properties
	check("podRef.name pattern", pod["name"].Pattern, buildlockv1.PodNamePattern)
	check("podRef.name maxLength", *pod["name"].MaxLength, int64(buildlockv1.MaxPodNameLength))
	check("podRef.uid pattern", pod["uid"].Pattern, buildlockv1.PodUIDPattern)
	check("podRef.uid maxLength", *pod["uid"].MaxLength, int64(buildlockv1.MaxPodUIDLength))
	expires := rules(p["expiresAfter"])
	check("expiresAfter rule has the duration pattern", strings.Contains(expires, "r'"+buildlockv1.DurationPattern+"'"), true)
	check("expiresAfter rule has the bounds", strings.Contains(expires, "duration('"+durationText(buildlockv1.MinExpiresAfter)+"')") &&
		strings.Contains(expires, "duration('"+durationText(buildlockv1.MaxExpiresAfter)+"')"), true)
	for _, field := range []string{"timestamp", "renewTime"} {
		check(field+" rule has the time pattern", strings.Contains(rules(p[field]), "r'"+buildlockv1.TimePattern+"'"), true)
	}
	policy := readSchema(t, "buildlock.io_buildlockpolicies.yaml").Properties["spec"].Properties
	maxHold := rules(policy["maxHold"])
	check("maxHold rule has the duration pattern", strings.Contains(maxHold, "r'"+buildlockv1.DurationPattern+"'"), true)
	check("maxHold rule has the bounds", strings.Contains(maxHold, "duration('"+durationText(buildlockv1.MinMaxHold)+"')") &&
		strings.Contains(maxHold, "duration('"+durationText(buildlockv1.MaxMaxHold)+"')"), true)
}

// TestTargetFieldIsSelectable keeps TargetField a selectable field of the
// generated CRD, so that a list by it works against the API server.
func TestTargetFieldIsSelectable(t *testing.T) {
	fields := readVersion(t, "buildlock.io_buildlocks.yaml").SelectableFields
	for _, f := range fields {
		if f.JSONPath == "."+buildlockv1.TargetField {
			return
		}
	}
	t.Errorf("the CRD has no selectable field .%s: %+v", buildlockv1.TargetField, fields)
}

// TestWindowValuesAreTheCRDs keeps the bounds and patterns of spec.windows
// equal to what the CRD enforces.
func TestWindowValuesAreTheCRDs(t *testing.T) {
	windows := readSchema(t, "buildlock.io_buildlockpolicies.yaml").Properties["spec"].Properties["windows"]
	check := func(what string, got, want any) {
		t.Helper()
		if got != want {
			t.Errorf("%s: the CRD has %v, api/v1alpha1 says %v", what, got, want)
		}
	}
	check("windows maxItems", *windows.MaxItems, int64(buildlockv1.MaxWindows))
	w := windows.Items.Schema.Properties
	check("schedule maxLength", *w["schedule"].MaxLength, int64(buildlockv1.MaxScheduleLength))
	schedule := rules(w["schedule"])
	check("schedule rules have the shape", strings.Contains(schedule, "self.matches(r'"+buildlockv1.ScheduleShapePattern+"')"), true)
	for i, f := range buildlockv1.CronFieldPatterns {
		fields := []string{`\S+`, `\S+`, `\S+`, `\S+`, `\S+`}
		fields[i] = f.Pattern
		check(f.Name+" rule has its pattern", strings.Contains(schedule, "r'^"+strings.Join(fields, " +")+"$'"), true)
	}
	zone := w["timeZone"]
	check("timeZone maxLength", *zone.MaxLength, int64(64))
	check("timeZone rules have the pattern", strings.Count(rules(zone), "r'"+buildlockv1.TimeZonePattern+"'"), 2)
	duration := rules(w["duration"])
	check("duration rule has the duration pattern", strings.Contains(duration, "r'"+buildlockv1.DurationPattern+"'"), true)
	check("duration rule has the bounds", strings.Contains(duration, "duration('"+durationText(buildlockv1.MinWindowDuration)+"')") &&
		strings.Contains(duration, "duration('"+durationText(buildlockv1.MaxWindowDuration)+"')"), true)
	check("reason maxLength", *w["reason"].MaxLength, int64(buildlockv1.MaxWindowReasonLength))
	check("reason rule has the forbidden characters", strings.Contains(rules(w["reason"]), "["+buildlockv1.BranchForbiddenChars+"]"), true)
	check("name pattern", w["name"].Pattern, buildlockv1.TargetPattern)
	for _, field := range []string{"start", "end"} {
		check(field+" rule has the time pattern", strings.Contains(rules(w[field]), "r'"+buildlockv1.TimePattern+"'"), true)
	}
}

// durationText writes d as the markers do: "10s", "24h", "1m", "168h".
func durationText(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return strings.TrimSuffix(d.String(), "0m0s")
	case d%time.Minute == 0:
		return strings.TrimSuffix(d.String(), "0s")
	}
	return d.String()
}

// TestPatternsCompile checks the patterns are valid Go regular expressions
// that accept and refuse what their documentation says.
func TestPatternsCompile(t *testing.T) {
	for pattern, cases := range map[string]map[string]bool{
		buildlockv1.BranchPattern:   {"main": true, "feature/übersetzung": true, "fix\nx": false, "a\x1b[31m": false, "evil\u202etxt": false, "tab\t": false, "": false},
		buildlockv1.TimePattern:     {"2026-11-30T22:45:00Z": true, "2026-11-30T22:45:00.123456789+14:00": true, "2026-11-30t22:45:00z": false, "2026-11-30T22:45:00": false},
		buildlockv1.DurationPattern: {"30m": true, "1h0m0s": true, "1.5h": true, "99999999999h": false, "3600": false, "-1m": false},
		buildlockv1.PodUIDPattern:   {"0f9c4e2a-7b1d-4c3e-9a5f-123456789abc": true, "abc": false},
		buildlockv1.TimeZonePattern: {"Europe/Berlin": true, "America/Argentina/Buenos_Aires": true, "Etc/GMT+5": true, "UTC": true,
			"+01:00": false, "../etc": false, "Europe/": false, "": false},
		buildlockv1.ScheduleShapePattern:              {"0 18 * * FRI": true, "0  18 * * FRI": true, "0 18 * *": false, "0 0 18 * * FRI": false, " 0 18 * * FRI": false},
		"^" + buildlockv1.CronMinutePattern + "$":     {"*": true, "0,15,30-45/5": true, "5/15": true, "60": false, "*/0": false, "-1": false},
		"^" + buildlockv1.CronHourPattern + "$":       {"23": true, "9-17": true, "24": false},
		"^" + buildlockv1.CronDayOfMonthPattern + "$": {"31": true, "1-7,15": true, "0": false, "32": false, "L": false, "?": false},
		"^" + buildlockv1.CronMonthPattern + "$":      {"JAN-mar,6,Oct": true, "13": false, "JANUARY": false},
		"^" + buildlockv1.CronDayOfWeekPattern + "$":  {"mon-fri": true, "0": true, "6": true, "7": false, "5#3": false},
	} {
		re := regexp.MustCompile(pattern)
		for s, want := range cases {
			if re.MatchString(s) != want {
				t.Errorf("%q matching %q: got %v, want %v", pattern, s, !want, want)
			}
		}
	}
}
