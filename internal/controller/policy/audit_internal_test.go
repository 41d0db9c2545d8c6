package policy

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

func TestBypassCondition(t *testing.T) {
	lock := arbiter.Lock{Namespace: "ci", Target: "staging"}
	pipeline, deployer := "system:serviceaccount:ci:pipeline", "system:serviceaccount:ci:deployer"
	for name, tc := range map[string]struct {
		state        auditState
		status       metav1.ConditionStatus
		reason       string
		says, saysNo []string
	}{
		"no identity may get around the fence": {
			state:  auditState{identities: 2},
			status: metav1.ConditionFalse, reason: buildlockv1.ReasonNoBypass,
			says: []string{"None of the 2 fenced pipeline identities of ci", "only while they hold its lock"},
		},
		"the gravest right found is the reason, and each right says who and how to close it": {
			state: auditState{identities: 2, bypasses: []buildlockv1.FenceBypass{
				{Identity: deployer, Rights: []buildlockv1.BypassRight{buildlockv1.BypassWorkloads}},
				{Identity: pipeline, Rights: []buildlockv1.BypassRight{buildlockv1.BypassServiceAccountTokens, buildlockv1.BypassWorkloads}},
			}},
			status: metav1.ConditionTrue, reason: buildlockv1.ReasonServiceAccountTokens,
			says: []string{pipeline + " may create tokens of staging's service accounts",
				deployer + ", " + pipeline + " may leave workloads in staging", "Close it", "take create on serviceaccounts/token from their roles in staging",
				"let no service account of staging write into it"},
			saysNo: []string{"impersonate service accounts or users"},
		},
		"impersonation comes first": {
			state:  auditState{identities: 1, bypasses: []buildlockv1.FenceBypass{{Identity: pipeline, Rights: rightsOrder}}},
			status: metav1.ConditionTrue, reason: buildlockv1.ReasonImpersonation,
			says: []string{pipeline + " may impersonate service accounts or users", "take impersonate from their roles in staging and ci"},
		},
		"an audit that failed says why, and is Unknown": {
			state:  auditState{err: errors.New("subjectaccessreviews is forbidden"), bypasses: []buildlockv1.FenceBypass{{Identity: pipeline}}},
			status: metav1.ConditionUnknown, reason: buildlockv1.ReasonAuditFailed,
			says: []string{"could not audit the fence of namespace staging", "subjectaccessreviews is forbidden"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := bypassCondition(lock, 7, tc.state)
			if c.Type != buildlockv1.ConditionBypassable || c.Status != tc.status || c.Reason != tc.reason || c.ObservedGeneration != 7 {
				t.Fatalf("got %s=%s (%s, generation %d), want %s (%s)", c.Type, c.Status, c.Reason, c.ObservedGeneration, tc.status, tc.reason)
			}
			for _, want := range tc.says {
				if !strings.Contains(c.Message, want) {
					t.Errorf("the message %q does not say %q", c.Message, want)
				}
			}
			for _, not := range tc.saysNo {
				if strings.Contains(c.Message, not) {
					t.Errorf("the message %q says %q", c.Message, not)
				}
			}
		})
	}
}

func TestBypassConditionMessageIsBounded(t *testing.T) {
	var bypasses []buildlockv1.FenceBypass
	for i := range maxReportedBypasses * 10 {
		bypasses = append(bypasses, buildlockv1.FenceBypass{
			Identity: "system:serviceaccount:ci:" + strings.Repeat("ä", 100) + string(rune('a'+i%26)), Rights: rightsOrder})
	}
	c := bypassCondition(arbiter.Lock{Namespace: "ci", Target: "staging"}, 1, auditState{bypasses: bypasses, identities: len(bypasses)})
	if len(c.Message) > maxConditionMessage || !utf8.ValidString(c.Message) || !strings.HasSuffix(c.Message, "…") {
		t.Errorf("a message of %d bytes (valid UTF-8: %t), want at most %d, cut on a rune", len(c.Message), utf8.ValidString(c.Message), maxConditionMessage)
	}
	if got := reported(bypasses); len(got) != maxReportedBypasses {
		t.Errorf("status.bypasses holds %d, want the CRD's bound %d", len(got), maxReportedBypasses)
	}
}

// TestBypassChecks: each right asks about the target (and impersonation
// about the claims namespace and users too), never about another
// namespace.
func TestBypassChecks(t *testing.T) {
	checks := bypassChecks("ci", "staging")
	for _, right := range rightsOrder {
		if len(checks[right]) == 0 {
			t.Errorf("no check gives the right %s", right)
		}
		for _, acc := range checks[right] {
			if acc.namespace != "staging" && acc.namespace != "ci" && acc.resource != "users" {
				t.Errorf("%s: a check of %+v asks about another namespace", right, acc)
			}
		}
	}
	if len(checks) != len(rightsOrder) {
		t.Errorf("checks of %d rights; rightsOrder lists %d", len(checks), len(rightsOrder))
	}
	self := bypassChecks("staging", "staging")[buildlockv1.BypassImpersonate]
	if len(self) != 2 {
		t.Errorf("a target that is its own claims namespace asks about impersonation %d times, want 2: %+v", len(self), self)
	}
}
