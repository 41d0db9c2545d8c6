package crd_test

import (
	"fmt"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// Issue 31, break 11: free text that names a line or gives a person's
// reason admitted zero-width and bidirectional characters and line
// separators, so that ma<U+200B>in was a line apart from main that reads
// the same in every message. Admission refuses them, and names the
// character and where it is, in the words the plugin uses too
// (buildlockv1.TextError).

// lookAlikes are texts that read like main, or like a reason, but are not.
var lookAlikes = map[string]string{
	"a zero-width space":                           "ma\u200bin",
	"a zero-width no-break space (BOM)":            "\ufeffmain",
	"a left-to-right mark":                         "main\u200e",
	"an Arabic letter mark":                        "ma\u061cin",
	"a line separator":                             "main\u2028",
	"a paragraph separator":                        "ma\u2029in",
	"a zero-width joiner":                          "ma\u200din",
	"a right-to-left override":                     "main\u202egnp.exe",
	"a tab":                                        "ma\tin",
	"a Hangul filler, a letter that shows nothing": "ma\u3164in",
	"a tag character, outside the BMP":             "main\U000e0041",
}

// fields are the free texts of a BuildLock the rule covers, with how to
// set one on the claim.
var textFields = map[string]func(string) mutation{
	"spec.branch":          func(s string) mutation { return set("spec.branch", s) },
	"spec.workflow":        func(s string) mutation { return set("spec.workflow", s) },
	"spec.rollback.reason": func(s string) mutation { return set("spec.rollback", map[string]any{"reason": "INC-7 " + s}) },
	// Without the requester policy (this suite installs none) a client
	// may write spec.requester: its texts are refused alike.
	"spec.requester.username": func(s string) mutation {
		return set("spec.requester", map[string]any{"username": "alice" + s})
	},
	"spec.requester.repository": func(s string) mutation {
		return set("spec.requester", map[string]any{"username": "ci", "repository": "acme/shop" + s})
	},
	"spec.requester.workflow": func(s string) mutation {
		return set("spec.requester", map[string]any{"username": "ci", "workflow": "deploy.yml" + s})
	},
}

var _ = Describe("Look-alike text", Label("validation"), func() {
	var namespace string

	BeforeEach(func() {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "text-"}}
		Expect(k8sClient.Create(ctx, ns)).To(Succeed())
		namespace = ns.Name
	})

	It("refuses invisible, bidirectional and control characters in every BuildLock text, naming the character and its position as the plugin does", func() {
		for field, setTo := range textFields {
			for what, text := range lookAlikes {
				u := validClaim(namespace)
				setTo(text)(u)
				err := k8sClient.Create(ctx, u)
				value, _, _ := unstructuredString(u, field)
				want := buildlockv1.TextError(field, value)
				Expect(want).To(HaveOccurred(), "%s with %s: the Go check finds nothing", field, what)
				Expect(err).To(beInvalid(field+": ", want.Error()), "%s with %s", field, what)
			}
		}
	})

	It("accepts text a person writes", func() {
		for i, text := range []string{"main", "feature/übersetzung", "release/2026.12", "修复/登录", "hotfix 🚀", "naïve café"} {
			u := validClaim(namespace)
			u.SetName(fmt.Sprintf("claim-%d", i))
			set("spec.branch", text)(u)
			set("spec.workflow", ".github/workflows/"+text+".yml")(u)
			set("spec.rollback", map[string]any{"reason": "INC-7: " + text})(u)
			Expect(k8sClient.Create(ctx, u)).To(Succeed(), "%q", text)
			Expect(buildlockv1.TextError("spec.branch", text)).NotTo(HaveOccurred())
		}
	})

	It("names the first refused character and counts characters, not bytes", func() {
		u := validClaim(namespace)
		set("spec.branch", "übersetzung\u200b\u200e")(u)
		Expect(k8sClient.Create(ctx, u)).To(beInvalid("spec.branch must not contain invisible, bidirectional or " +
			"control characters: it has U+200B at character 12; write it without that character"))
		u = validClaim(namespace)
		set("spec.branch", "\x01main")(u)
		Expect(k8sClient.Create(ctx, u)).To(beInvalid("it has U+0001 at character 1"))
	})

	It("refuses them in a window's reason and frozenBy", func() {
		for what, text := range lookAlikes {
			for field, change := range map[string]mutation{
				"a window reason": window(weekend, with("reason", "holiday "+text)),
				"frozenBy": window(holiday, func(w map[string]any) {
					w["frozenBy"] = "alice" + text
				}),
			} {
				u := validPolicy(namespace)
				change(u)
				err := k8sClient.Create(ctx, u)
				Expect(err).To(beInvalid(field+" must not contain invisible, bidirectional or control characters: it has U+"),
					"%s with %s", field, what)
			}
		}
	})
})

// unstructuredString returns the string at the dotted path of u.
func unstructuredString(u interface {
	UnstructuredContent() map[string]any
}, path string) (string, bool, error) {
	m := u.UnstructuredContent()
	parts := strings.Split(path, ".")
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			return "", false, nil
		}
		m = next
	}
	s, ok := m[parts[len(parts)-1]].(string)
	return s, ok, nil
}
