package admission_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/buildlock/buildlock/internal/controller/admission"
	"github.com/buildlock/buildlock/internal/testenv"
)

// TestIdentityPoliciesAreConfigIdentity holds the operator's list of
// identity policies, whose absence it reports, to config/identity: the
// same policy names, each policy with a binding of its name. config/identity
// also holds buildlock-text, which every install gets with them but which
// verifies nobody: it refuses look-alike characters in the annotations
// that carry someone's text, and its absence widens nobody's rights (the
// operator escapes what it quotes), so it is no identity policy.
func TestIdentityPoliciesAreConfigIdentity(t *testing.T) {
	objs, err := testenv.ConfigObjects(testenv.IdentityDir)
	if err != nil {
		t.Fatal(err)
	}
	policies, bindings := map[string]bool{}, map[string]bool{}
	for _, o := range objs {
		switch kind := o.GetKind(); {
		case strings.HasSuffix(kind, "AdmissionPolicy"):
			policies[o.GetName()] = true
		case strings.HasSuffix(kind, "AdmissionPolicyBinding"):
			bindings[kind+"/"+o.GetName()] = true
			if o.Object["spec"].(map[string]any)["policyName"] != o.GetName() {
				t.Errorf("%s %s binds another policy than its namesake", kind, o.GetName())
			}
		}
	}
	var names []string
	for name := range policies {
		if name == "buildlock-text" {
			continue
		}
		names = append(names, name)
	}
	slices.Sort(names)
	if got := admission.IdentityPolicies(); !slices.Equal(got, names) {
		t.Errorf("the operator knows the identity policies %v; config/identity has %v", got, names)
	}
	for _, o := range objs {
		if kind := o.GetKind(); strings.HasSuffix(kind, "AdmissionPolicy") && !bindings[kind+"Binding/"+o.GetName()] {
			t.Errorf("config/identity: %s %s has no binding of its name", kind, o.GetName())
		}
	}
}
