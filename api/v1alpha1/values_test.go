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
	// Patterns are CEL rules with a message (a raw pattern in an error says
	// nothing a person can act on): self.matches(r'<pattern>').
	hasPattern := func(field apiextensionsv1.JSONSchemaProps, pattern string) bool {
		return field.Pattern == "" && strings.Contains(rules(field), "self.matches(r'"+pattern+"')")
	}
	check("target pattern", hasPattern(p["target"], buildlockv1.TargetPattern), true)
	check("target maxLength", *p["target"].MaxLength, int64(buildlockv1.MaxTargetLength))
	check("repo pattern", hasPattern(p["repo"], buildlockv1.RepoPattern), true)
	check("repo minLength", *p["repo"].MinLength, int64(buildlockv1.MinRepoLength))
	check("repo maxLength", *p["repo"].MaxLength, int64(buildlockv1.MaxRepoLength))
	check("branch maxLength", *p["branch"].MaxLength, int64(buildlockv1.MaxBranchLength))
	check("branch rule has the forbidden characters", strings.Contains(rules(p["branch"]), "["+buildlockv1.BranchForbiddenChars+"]"), true)
	check("build maximum", int64(*p["build"].Maximum), int64(buildlockv1.MaxBuild))
	pod := p["podRef"].Properties
	check("podRef.name pattern", hasPattern(pod["name"], buildlockv1.PodNamePattern), true)
	check("podRef.name maxLength", *pod["name"].MaxLength, int64(buildlockv1.MaxPodNameLength))
	check("podRef.uid pattern", hasPattern(pod["uid"], buildlockv1.PodUIDPattern), true)
	check("workflow maxLength", *p["workflow"].MaxLength, int64(buildlockv1.MaxWorkflowLength))
	check("workflow rule has the forbidden characters", strings.Contains(rules(p["workflow"]), "["+buildlockv1.BranchForbiddenChars+"]"), true)
	reason := p["rollback"].Properties["reason"]
	check("rollback reason maxLength", *reason.MaxLength, int64(buildlockv1.MaxRollbackReasonLength))
	check("rollback reason rule has the forbidden characters", strings.Contains(rules(reason), "["+buildlockv1.BranchForbiddenChars+"]"), true)
	check("podRef.uid maxLength", *pod["uid"].MaxLength, int64(buildlockv1.MaxPodUIDLength))
	expires := rules(p["expiresAfter"])
	check("expiresAfter rule has the duration pattern", strings.Contains(expires, "r'"+buildlockv1.DurationPattern+"'"), true)
	check("expiresAfter rule has the bounds", strings.Contains(expires, "duration('"+durationText(buildlockv1.MinExpiresAfter)+"')") &&
		strings.Contains(expires, "duration('"+durationText(buildlockv1.MaxExpiresAfter)+"')"), true)
	for _, field := range []string{"timestamp", "renewTime"} {
		check(field+" rule has the time pattern", strings.Contains(rules(p[field]), "r'"+buildlockv1.TimePattern+"'"), true)
	}
	requester := p["requester"].Properties
	check("requester.repository maxLength", *requester["repository"].MaxLength, int64(buildlockv1.MaxRepoLength))
	check("requester.run pattern", requester["run"].Pattern, buildlockv1.CIRunPattern)
	check("requester.run maxLength", *requester["run"].MaxLength, int64(buildlockv1.MaxCIRunLength))
	policy := readSchema(t, "buildlock.io_buildlockpolicies.yaml").Properties["spec"].Properties
	repositories := policy["enforce"].Properties["repositories"]
	check("enforce.repositories pattern", repositories.Items.Schema.Pattern, buildlockv1.RepoPattern)
	check("enforce.repositories maxLength", *repositories.Items.Schema.MaxLength, int64(buildlockv1.MaxRepoLength))
	maxHold := rules(policy["maxHold"])
	check("maxHold rule has the duration pattern", strings.Contains(maxHold, "r'"+buildlockv1.DurationPattern+"'"), true)
	check("maxHold rule has the bounds", strings.Contains(maxHold, "duration('"+durationText(buildlockv1.MinMaxHold)+"')") &&
		strings.Contains(maxHold, "duration('"+durationText(buildlockv1.MaxMaxHold)+"')"), true)
}

// TestEveryFreeTextRefusesLookAlikes keeps the CRDs' free texts that name a
// line or give a reason (issue 31) under TextRule, with the message of
// TextMessageExpression: the markers repeat them literally.
func TestEveryFreeTextRefusesLookAlikes(t *testing.T) {
	spec := readSchema(t, "buildlock.io_buildlocks.yaml").Properties["spec"].Properties
	windows := readSchema(t, "buildlock.io_buildlockpolicies.yaml").Properties["spec"].Properties["windows"].Items.Schema.Properties
	for field, p := range map[string]apiextensionsv1.JSONSchemaProps{
		"spec.branch":               spec["branch"],
		"spec.workflow":             spec["workflow"],
		"spec.rollback.reason":      spec["rollback"].Properties["reason"],
		"spec.requester.username":   spec["requester"].Properties["username"],
		"spec.requester.repository": spec["requester"].Properties["repository"],
		"spec.requester.workflow":   spec["requester"].Properties["workflow"],
		"a window reason":           windows["reason"],
		"frozenBy":                  windows["frozenBy"],
	} {
		found := false
		for _, r := range p.XValidations {
			if r.Rule == buildlockv1.TextRule {
				found = true
				if r.MessageExpression != buildlockv1.TextMessageExpression(field) || r.Message != buildlockv1.TextMessage(field) {
					t.Errorf("%s: the rule's message is not TextMessageExpression(%q): %q", field, field, r.MessageExpression)
				}
			}
		}
		if !found {
			t.Errorf("%s has no rule %s: %s", field, buildlockv1.TextRule, rules(p))
		}
	}
}

func TestTextError(t *testing.T) {
	for text, want := range map[string]string{
		"main":                "",
		"feature/übersetzung": "",
		"hotfix 🚀":            "",
		"ma\u200bin":          "spec.branch must not contain invisible, bidirectional or control characters: it has U+200B at character 3; write it without that character",
		"\ufeffmain":          "it has U+FEFF at character 1;",
		"übersetzung\u200e":   "it has U+200E at character 12;",
		"ma\u061cin":          "it has U+061C at character 3;",
		"main\u2028":          "it has U+2028 at character 5;",
		"ma\tin":              "it has U+0009 at character 3;",
		"ma\u3164in":          "it has U+3164 at character 3;",
		"main\U000e0041":      "it has U+E0041 at character 5;",
		"a\u200bb\u202ec":     "it has U+200B at character 2;",
	} {
		err := buildlockv1.TextError("spec.branch", text)
		switch {
		case want == "" && err != nil:
			t.Errorf("%q refused: %v", text, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%q: %v, want %q", text, err, want)
		}
		if ok := regexp.MustCompile(buildlockv1.BranchPattern).MatchString(text); ok != (want == "") {
			t.Errorf("%q: BranchPattern matches %v", text, ok)
		}
	}
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
	check("name rule has the target pattern", strings.Contains(rules(w["name"]), "r'"+buildlockv1.TargetPattern+"'"), true)
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
		buildlockv1.CIRunPattern:    {"5005/1": true, "12345": true, "a;b": false, "a\nb": false, "": false},
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

// TestTheTextPolicyIsTheAPIs keeps config/identity/text.yaml's
// validations equal to TextAnnotationRule and
// TextAnnotationMessageExpression, one for each of TextAnnotations.
func TestTheTextPolicyIsTheAPIs(t *testing.T) {
	b, err := os.ReadFile("../../config/identity/text.yaml")
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(b), "\n---\n")
	var vap struct {
		Spec struct {
			Validations []struct{ Expression, MessageExpression string }
		}
	}
	if err := yaml.Unmarshal([]byte(first), &vap); err != nil {
		t.Fatal(err)
	}
	if len(vap.Spec.Validations) != len(buildlockv1.TextAnnotations) {
		t.Fatalf("%d validations for %d annotations", len(vap.Spec.Validations), len(buildlockv1.TextAnnotations))
	}
	for k, key := range buildlockv1.TextAnnotations {
		v := vap.Spec.Validations[k]
		if v.Expression != buildlockv1.TextAnnotationRule(key) || v.MessageExpression != buildlockv1.TextAnnotationMessageExpression(key) {
			t.Errorf("the validation of %s is not the API's: %+v", key, v)
		}
	}
}
