package admission

import (
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/buildlock/buildlock/internal/arbiter"
)

// installed returns Policies reading a cache that holds the admission
// objects named "<kind>/<name>", created at created; mutating says whether
// the cluster serves MutatingAdmissionPolicies.
func installed(t *testing.T, mutating bool, created time.Time, objects ...string) *Policies {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	var objs []client.Object
	for _, o := range objects {
		kind, name, _ := strings.Cut(o, "/")
		obj := admissionMetadata(kind)
		obj.Name, obj.CreationTimestamp = name, metav1.NewTime(created)
		objs = append(objs, obj)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
	return &Policies{cache: c, bindings: c, mutating: mutating}
}

// every is every object of config/identity.
func every() []string {
	var objs []string
	for _, p := range identityPolicies {
		if p.mutating {
			objs = append(objs, mutatingPolicyKind+"/"+p.name, mutatingBindingKind+"/"+p.name)
		}
		if p.validating {
			objs = append(objs, ValidatingPolicy+"/"+p.name, validatingBindingKind+"/"+p.name)
		}
	}
	return objs
}

func TestMissingIdentity(t *testing.T) {
	now := time.Now()
	without := func(drop string) []string {
		return slices.DeleteFunc(every(), func(o string) bool { return o == drop })
	}
	for name, tc := range map[string]struct {
		a           *Policies
		missing     []string
		verified    bool
		says, never string
	}{
		"all installed": {a: installed(t, true, now, every()...), verified: true},
		"nothing installed": {a: installed(t, true, now), missing: IdentityPolicies(),
			says: "install them: the chart's identity.enabled"},
		"a validating policy without its binding does nothing": {
			a:       installed(t, true, now, without(validatingBindingKind+"/buildlock-override")...),
			missing: []string{"buildlock-override"}, verified: true, says: "buildlock-override (install them"},
		"the requester's binding missing: no requester is verified": {
			a:       installed(t, true, now, without(mutatingBindingKind+"/"+requesterPolicyName)...),
			missing: []string{requesterPolicyName}},
		"a cluster without MutatingAdmissionPolicies": {
			a: installed(t, false, now, every()...), missing: []string{requesterPolicyName, forceReleasePolicyName, overridePolicyName},
			says: "serves no MutatingAdmissionPolicies", never: "install them"},
		"none known (nil)": {missing: IdentityPolicies()},
	} {
		t.Run(name, func(t *testing.T) {
			got := tc.a.MissingIdentity()
			slices.Sort(tc.missing)
			if !slices.Equal(got, tc.missing) {
				t.Errorf("missing %v, want %v", got, tc.missing)
			}
			msg := tc.a.IdentityMessage()
			if (msg == "") != (len(tc.missing) == 0) {
				t.Errorf("message %q with %d missing", msg, len(tc.missing))
			}
			for _, m := range tc.missing {
				if !strings.Contains(msg, m) {
					t.Errorf("the message %q does not name %s", msg, m)
				}
			}
			if tc.says != "" && !strings.Contains(msg, tc.says) {
				t.Errorf("the message %q does not say %q", msg, tc.says)
			}
			if tc.never != "" && strings.Contains(msg, tc.never) {
				t.Errorf("the message %q says %q", msg, tc.never)
			}
			if verified := !tc.a.RequestersVerifiedSince(time.Second).IsZero(); verified != tc.verified {
				t.Errorf("requesters verified: %t, want %t", verified, tc.verified)
			}
		})
	}
}

// TestUnverifyNeedsBindings: a stamp counts only while the policies that
// stamp and guard it are installed with their bindings.
func TestUnverifyNeedsBindings(t *testing.T) {
	claims := func() []arbiter.Claim {
		return []arbiter.Claim{{ForceReleasedBy: "alice", Override: arbiter.Override{By: "bob"}}}
	}
	all := installed(t, true, time.Now(), every()...)
	got := claims()
	all.Unverify(got)
	if got[0].ForceReleasedBy != "alice" || got[0].Override.By != "bob" {
		t.Errorf("with every policy installed: %+v", got[0])
	}
	for _, drop := range []string{validatingBindingKind + "/" + forceReleasePolicyName, mutatingBindingKind + "/" + forceReleasePolicyName} {
		a := installed(t, true, time.Now(), slices.DeleteFunc(every(), func(o string) bool { return o == drop })...)
		got := claims()
		a.Unverify(got)
		if got[0].ForceReleasedBy != "" || got[0].Override.By != "bob" {
			t.Errorf("without %s: %+v, want the force-release unverified only", drop, got[0])
		}
	}
}
