package controller_test

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/types"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1alpha1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// These specs apply BuildLocks to the real API server of the suite, with no
// manager running: what they prove is that the CRD's schema and CEL rules
// alone (there is no webhook) reject every malformed claim with a message that
// names the field. Objects are unstructured so that a test can send what the
// Go types cannot express: a missing required field, "abc" as a duration, a
// string where a number belongs.

const (
	// claimName is the BuildLock each spec creates, in a namespace of its own.
	claimName = "claim"

	podUID    = "0f9c4e2a-7b1d-4c3e-9a5f-123456789abc"
	startedAt = "2026-01-02T03:04:05.000000Z"
	renewedAt = "2026-01-02T04:00:00.000000Z"

	// CEL messages from api/v1alpha1/buildlock_types.go.
	msgExpiresAfterBounds = "spec.expiresAfter must be between 10s and 24h, for example 30m"
	msgRenewForward       = "spec.renewTime may only move forward: set it to the current time, never earlier than its last value, and never remove it"
)

// msgImmutable is the CEL message of every spec field but renewTime.
func msgImmutable(field string) string {
	return "spec." + field + " is immutable: delete this BuildLock and create a new one"
}

// mutation changes a BuildLock before it is sent.
type mutation func(u *unstructured.Unstructured)

// set sets the field at the dotted path (e.g. "spec.podRef.name") to value.
func set(path string, value any) mutation {
	return func(u *unstructured.Unstructured) {
		GinkgoHelper()
		Expect(unstructured.SetNestedField(u.Object, value, strings.Split(path, ".")...)).To(Succeed())
	}
}

// unset removes the field at the dotted path.
func unset(path string) mutation {
	return func(u *unstructured.Unstructured) {
		unstructured.RemoveNestedField(u.Object, strings.Split(path, ".")...)
	}
}

// all applies mutations in order.
func all(ms ...mutation) mutation {
	return func(u *unstructured.Unstructured) {
		for _, m := range ms {
			m(u)
		}
	}
}

// withPod gives the claim a podRef with name and UID.
var withPod = set("spec.podRef", map[string]any{"name": "pipeline-42", "uid": podUID})

// validClaim is a minimal valid BuildLock: the four required fields.
func validClaim(namespace string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{
			"target": "staging",
			"repo":   "acme/shop",
			"branch": "main",
			"build":  int64(42),
		},
	}}
	u.SetGroupVersionKind(buildlockv1alpha1.GroupVersion.WithKind("BuildLock"))
	u.SetNamespace(namespace)
	u.SetName(claimName)
	return u
}

// dnsSubdomain returns a valid DNS-1123 subdomain of exactly n characters:
// labels of up to 63 'a's joined by dots.
func dnsSubdomain(n int) string {
	var b strings.Builder
	for b.Len() < n {
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(strings.Repeat("a", min(63, n-b.Len())))
	}
	return b.String()
}

// beInvalid matches a 422 Invalid error whose message contains every want:
// the field path, and the CEL message where the schema has one.
func beInvalid(wants ...string) types.GomegaMatcher {
	matchers := []types.GomegaMatcher{Satisfy(apierrors.IsInvalid)}
	for _, w := range wants {
		matchers = append(matchers, MatchError(ContainSubstring(w)))
	}
	return SatisfyAll(matchers...)
}

var _ = Describe("Validation", Label("validation"), func() {
	var namespace string

	BeforeEach(func() {
		// A namespace per spec, so that entries cannot see each other's claims.
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "validation-"}}
		Expect(k8sClient.Create(ctx, ns)).To(Succeed())
		namespace = ns.Name
	})

	// create sends the valid claim changed by m.
	create := func(m mutation) (*unstructured.Unstructured, error) {
		u := validClaim(namespace)
		m(u)
		return u, k8sClient.Create(ctx, u)
	}

	// get reads the claim back from the API server.
	get := func() *unstructured.Unstructured {
		GinkgoHelper()
		u := validClaim(namespace)
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(u), u)).To(Succeed())
		return u
	}

	// createValid creates the valid claim changed by m and expects success.
	createValid := func(m mutation) *unstructured.Unstructured {
		GinkgoHelper()
		u, err := create(m)
		Expect(err).NotTo(HaveOccurred())
		return u
	}

	DescribeTable("rejects a malformed BuildLock on create",
		func(m mutation, wants ...string) {
			_, err := create(m)
			GinkgoWriter.Printf("Rejected: %v\n", err)
			Expect(err).To(beInvalid(wants...))
		},

		// Required fields.
		Entry("without spec", unset("spec"), "spec: Required value"),
		Entry("without spec.target", unset("spec.target"), "spec.target: Required value"),
		Entry("without spec.repo", unset("spec.repo"), "spec.repo: Required value"),
		Entry("without spec.branch", unset("spec.branch"), "spec.branch: Required value"),
		Entry("without spec.build", unset("spec.build"), "spec.build: Required value"),
		Entry("with a podRef without name", set("spec.podRef", map[string]any{"uid": podUID}),
			"spec.podRef.name: Required value"),

		// spec.target: a DNS-1123 label.
		Entry("with an empty target", set("spec.target", ""), "spec.target"),
		Entry("with an uppercase target", set("spec.target", "Staging"), "spec.target", "should match"),
		Entry("with a target of 64 characters", set("spec.target", strings.Repeat("a", 64)),
			"spec.target", "Too long", "63"),
		Entry("with a target with a leading dash", set("spec.target", "-staging"), "spec.target", "should match"),
		Entry("with a target with a trailing dash", set("spec.target", "staging-"), "spec.target", "should match"),
		Entry("with a target with dots", set("spec.target", "staging.eu"), "spec.target", "should match"),
		Entry("with a target with an underscore", set("spec.target", "stag_ing"), "spec.target", "should match"),

		// spec.repo: owner/name.
		Entry("with an empty repo", set("spec.repo", ""), "spec.repo"),
		Entry("with a repo without owner", set("spec.repo", "shop"), "spec.repo", "should match"),
		Entry("with a repo with a space", set("spec.repo", "acme/my shop"), "spec.repo", "should match"),
		Entry("with a repo with an empty segment", set("spec.repo", "acme//shop"), "spec.repo", "should match"),
		Entry("with a repo with a leading slash", set("spec.repo", "/shop"), "spec.repo", "should match"),
		Entry("with a repo with a trailing slash", set("spec.repo", "acme/"), "spec.repo", "should match"),
		Entry("with a repo given as a URL", set("spec.repo", "https://github.com/acme/shop"),
			"spec.repo", "should match"),
		Entry("with a repo of 256 characters", set("spec.repo", "acme/"+strings.Repeat("s", 251)),
			"spec.repo", "Too long", "255"),

		// spec.branch: non-empty, bounded.
		Entry("with an empty branch", set("spec.branch", ""), "spec.branch"),
		Entry("with a branch of 256 characters", set("spec.branch", strings.Repeat("b", 256)),
			"spec.branch", "Too long", "255"),

		// spec.build: an integer of at least 1.
		Entry("with build 0", set("spec.build", int64(0)), "spec.build", "should be greater than or equal to 1"),
		Entry("with a negative build", set("spec.build", int64(-7)), "spec.build", "should be greater than or equal to 1"),
		Entry("with a build given as a string", set("spec.build", "42"), "spec.build", "integer"),

		// spec.podRef: a pod name in this namespace, an optional UID.
		Entry("with an empty podRef name", set("spec.podRef", map[string]any{"name": ""}), "spec.podRef.name"),
		Entry("with an uppercase podRef name", set("spec.podRef", map[string]any{"name": "Pipeline-42"}),
			"spec.podRef.name", "should match"),
		Entry("with a podRef name of 254 characters", set("spec.podRef", map[string]any{"name": dnsSubdomain(254)}),
			"spec.podRef.name", "Too long", "253"),
		Entry("with a podRef to a pod in another namespace",
			set("spec.podRef", map[string]any{"name": "kube-system/etcd"}), "spec.podRef.name", "should match"),
		Entry("with a non-hex podRef uid", set("spec.podRef", map[string]any{"name": "pipeline-42", "uid": "not-a-uid!"}),
			"spec.podRef.uid", "should match"),
		Entry("with a podRef uid that is not a UUID", set("spec.podRef", map[string]any{"name": "pipeline-42", "uid": "------"}),
			"spec.podRef.uid", "should match"),
		Entry("with a podRef uid of 37 characters",
			set("spec.podRef", map[string]any{"name": "pipeline-42", "uid": podUID + "a"}),
			"spec.podRef.uid", "Too long", "36"),

		// spec.expiresAfter: a duration between 10s and 24h.
		Entry("with expiresAfter 5s", set("spec.expiresAfter", "5s"), "spec.expiresAfter", msgExpiresAfterBounds),
		Entry("with expiresAfter 9.999s", set("spec.expiresAfter", "9.999s"), "spec.expiresAfter", msgExpiresAfterBounds),
		Entry("with expiresAfter 25h", set("spec.expiresAfter", "25h"), "spec.expiresAfter", msgExpiresAfterBounds),
		Entry("with expiresAfter 24h1s", set("spec.expiresAfter", "24h1s"), "spec.expiresAfter", msgExpiresAfterBounds),
		Entry("with expiresAfter abc", set("spec.expiresAfter", "abc"), "spec.expiresAfter", "should match"),
		Entry("with expiresAfter -1m", set("spec.expiresAfter", "-1m"), "spec.expiresAfter", "should match"),
		Entry("with expiresAfter without unit", set("spec.expiresAfter", "3600"), "spec.expiresAfter", "should match"),
		Entry("with an empty expiresAfter", set("spec.expiresAfter", ""), "spec.expiresAfter"),
		Entry("with an expiresAfter that overflows", set("spec.expiresAfter", "9999999999h"),
			"spec.expiresAfter", msgExpiresAfterBounds),

		// Timestamps.
		Entry("with a timestamp that is not a time", set("spec.timestamp", "yesterday"),
			"spec.timestamp", "date-time"),
		Entry("with a renewTime that is not a time", set("spec.renewTime", "now"), "spec.renewTime", "date-time"),

		// Metadata: names and payloads at and past the API server's limits.
		Entry("with a name of 254 characters", set("metadata.name", dnsSubdomain(254)),
			"metadata.name", "must be no more than 253 characters"),
		Entry("with an uppercase name", set("metadata.name", "Claim"), "metadata.name", "RFC 1123"),
		Entry("with annotations over 256 KiB", set("metadata.annotations", map[string]any{
			"example.com/huge": strings.Repeat("x", 256*1024),
		}), "metadata.annotations", "Too long", "262144"),
		Entry("with a label value of 64 characters", set("metadata.labels", map[string]any{
			"buildlock.io/note": strings.Repeat("x", 64),
		}), "metadata.labels", "Invalid value", "no more than 63"),
		Entry("with an invalid label key", set("metadata.labels", map[string]any{"bad key": "x"}),
			"metadata.labels", "name part must consist of"),
	)

	It("rejects an unknown spec field under strict field validation", func() {
		_, err := create(set("spec.owner", "someone"))
		Expect(err).NotTo(HaveOccurred(), "without strict validation an unknown field is pruned, not an error")
		_, found, err := unstructured.NestedFieldNoCopy(get().Object, "spec", "owner")
		Expect(err).NotTo(HaveOccurred())
		Expect(found).To(BeFalse(), "the API server prunes fields the schema does not know")

		u := validClaim(namespace)
		u.SetName("strict")
		set("spec.owner", "someone")(u)
		err = k8sClient.Create(ctx, u, client.FieldValidation(metav1.FieldValidationStrict))
		Expect(err).To(SatisfyAll(Satisfy(apierrors.IsBadRequest), MatchError(ContainSubstring(`unknown field "spec.owner"`))))
	})

	DescribeTable("rejects a change to the spec after creation",
		func(initial, change mutation, wants ...string) {
			createValid(initial)
			u := get()
			change(u)
			err := k8sClient.Update(ctx, u)
			GinkgoWriter.Printf("Rejected: %v\n", err)
			Expect(err).To(beInvalid(wants...))
		},

		Entry("changing target", withPod, set("spec.target", "production"), msgImmutable("target")),
		Entry("changing repo", withPod, set("spec.repo", "acme/cart"), msgImmutable("repo")),
		Entry("changing branch", withPod, set("spec.branch", "release"), msgImmutable("branch")),
		Entry("raising build", withPod, set("spec.build", int64(43)), msgImmutable("build")),
		Entry("lowering build", withPod, set("spec.build", int64(41)), msgImmutable("build")),
		Entry("adding podRef", unset("spec.podRef"),
			set("spec.podRef", map[string]any{"name": "pipeline-42"}), msgImmutable("podRef")),
		Entry("removing podRef", withPod, unset("spec.podRef"), msgImmutable("podRef")),
		Entry("changing podRef name", withPod, set("spec.podRef.name", "pipeline-43"), msgImmutable("podRef")),
		Entry("changing podRef uid", withPod,
			set("spec.podRef.uid", "11111111-2222-3333-4444-555555555555"), msgImmutable("podRef")),
		Entry("removing podRef uid", withPod, unset("spec.podRef.uid"), msgImmutable("podRef")),
		Entry("adding timestamp", withPod, set("spec.timestamp", startedAt), msgImmutable("timestamp")),
		Entry("changing timestamp", set("spec.timestamp", startedAt),
			set("spec.timestamp", "2026-01-02T03:04:06.000000Z"), msgImmutable("timestamp")),
		Entry("removing timestamp", set("spec.timestamp", startedAt), unset("spec.timestamp"),
			msgImmutable("timestamp")),
		Entry("changing expiresAfter", set("spec.expiresAfter", "30m"), set("spec.expiresAfter", "2h"),
			msgImmutable("expiresAfter")),
		Entry("removing expiresAfter, which defaults it to 1h again", set("spec.expiresAfter", "30m"),
			unset("spec.expiresAfter"), msgImmutable("expiresAfter")),
		Entry("changing defaulted expiresAfter", unset("spec.expiresAfter"), set("spec.expiresAfter", "2h"),
			msgImmutable("expiresAfter")),
		Entry("moving renewTime backwards", set("spec.renewTime", renewedAt),
			set("spec.renewTime", "2026-01-02T03:59:59.999999Z"), msgRenewForward),
		Entry("removing renewTime", set("spec.renewTime", renewedAt), unset("spec.renewTime"), msgRenewForward),
		Entry("changing two fields at once", withPod,
			all(set("spec.target", "production"), set("spec.build", int64(43))),
			msgImmutable("target"), msgImmutable("build")),
	)

	It("rejects an unknown phase written through the status subresource", func() {
		createValid(withPod)
		u := get()
		Expect(unstructured.SetNestedField(u.Object, "Running", "status", "phase")).To(Succeed())
		Expect(k8sClient.Status().Update(ctx, u)).To(beInvalid("status.phase", "Unsupported value", `"Running"`))
	})

	It("rejects an Acquired condition with a status other than True, False or Unknown", func() {
		createValid(withPod)
		u := get()
		Expect(unstructured.SetNestedSlice(u.Object, []any{map[string]any{
			"type":               buildlockv1alpha1.ConditionAcquired,
			"status":             "Maybe",
			"reason":             buildlockv1alpha1.ReasonPending,
			"message":            "Not decided yet.",
			"lastTransitionTime": "2026-01-02T03:04:05Z",
		}}, "status", "conditions")).To(Succeed())
		Expect(k8sClient.Status().Update(ctx, u)).To(beInvalid("status.conditions[0].status", "Unsupported value"))
	})

	Context("accepts", func() {
		It("a minimal BuildLock and defaults expiresAfter to 1h", func() {
			createValid(func(*unstructured.Unstructured) {})

			expiresAfter, found, err := unstructured.NestedString(get().Object, "spec", "expiresAfter")
			Expect(err).NotTo(HaveOccurred())
			Expect(found).To(BeTrue())
			Expect(expiresAfter).To(Equal("1h"))

			var bl buildlockv1alpha1.BuildLock
			Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: claimName}, &bl)).To(Succeed())
			Expect(bl.Spec.ExpiresAfter).To(Equal(&metav1.Duration{Duration: time.Hour}))
			Expect(bl.Spec.PodRef).To(BeNil())
			Expect(bl.Spec.RenewTime).To(BeNil())
		})

		It("a fully specified BuildLock written with the Go types", func() {
			now := metav1.NewMicroTime(time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC))
			bl := &buildlockv1alpha1.BuildLock{
				ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: claimName},
				Spec: buildlockv1alpha1.BuildLockSpec{
					Target:       "staging",
					Repo:         "acme/shop",
					Branch:       "feature/checkout-v2",
					Build:        1,
					PodRef:       &buildlockv1alpha1.PodReference{Name: "pipeline-42", UID: podUID},
					Timestamp:    buildlockv1alpha1.NewTimestamp(now.Time),
					ExpiresAfter: &metav1.Duration{Duration: 90 * time.Second},
					RenewTime:    buildlockv1alpha1.NewTimestamp(now.Time),
				},
			}
			Expect(k8sClient.Create(ctx, bl)).To(Succeed())

			var got buildlockv1alpha1.BuildLock
			Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(bl), &got)).To(Succeed())
			Expect(got.Spec).To(Equal(bl.Spec), "the spec round-trips, microseconds included")
		})

		It("a name of exactly 253 characters", func() {
			name := dnsSubdomain(253)
			Expect(name).To(HaveLen(253))
			createValid(set("metadata.name", name))
		})

		DescribeTable("values at the edge of their bounds",
			func(m mutation) { createValid(m) },
			Entry("a GitLab nested group repo a/b/c", set("spec.repo", "a/b/c")),
			Entry("a deeply nested repo with dots, dashes and underscores",
				set("spec.repo", "my-group/sub.group/team_x/shop.web")),
			Entry("a repo of exactly 255 characters", set("spec.repo", "acme/"+strings.Repeat("s", 250))),
			Entry("a target of exactly 63 characters", set("spec.target", strings.Repeat("a", 63))),
			Entry("a single-character target", set("spec.target", "a")),
			Entry("a branch of exactly 255 characters", set("spec.branch", strings.Repeat("b", 255))),
			Entry("a branch with slashes and unicode", set("spec.branch", "feature/übersetzung")),
			Entry("build 1", set("spec.build", int64(1))),
			Entry("the largest build", set("spec.build", int64(1<<63-1))),
			Entry("a podRef without uid", set("spec.podRef", map[string]any{"name": "pipeline-42"})),
			Entry("a podRef name of exactly 253 characters",
				set("spec.podRef", map[string]any{"name": dnsSubdomain(253)})),
			Entry("expiresAfter of exactly 10s", set("spec.expiresAfter", "10s")),
			Entry("expiresAfter of exactly 24h", set("spec.expiresAfter", "24h")),
			Entry("expiresAfter in compound form", set("spec.expiresAfter", "1h30m")),
			Entry("annotations just under 256 KiB", set("metadata.annotations", map[string]any{
				"example.com/big": strings.Repeat("x", 255*1024),
			})),
		)

		It("renewTime moving forward, and re-applying the same spec", func() {
			createValid(set("spec.renewTime", renewedAt))

			u := get()
			set("spec.renewTime", "2026-01-02T04:00:00.000001Z")(u)
			Expect(k8sClient.Update(ctx, u)).To(Succeed())

			u = get()
			Expect(u.Object).To(HaveKeyWithValue("spec", HaveKeyWithValue("renewTime", "2026-01-02T04:00:00.000001Z")))
			Expect(k8sClient.Update(ctx, u)).To(Succeed(), "an unchanged renewTime is not a move backwards")
		})

		It("renewTime set for the first time after creation", func() {
			createValid(withPod)
			u := get()
			set("spec.renewTime", renewedAt)(u)
			Expect(k8sClient.Update(ctx, u)).To(Succeed())
		})

		It("a status with a known phase through the status subresource", func() {
			createValid(withPod)
			u := get()
			Expect(unstructured.SetNestedField(u.Object, string(buildlockv1alpha1.PhaseWaiting), "status", "phase")).To(Succeed())
			Expect(k8sClient.Status().Update(ctx, u)).To(Succeed())
			Expect(get().Object).To(HaveKeyWithValue("status", HaveKeyWithValue("phase", "Waiting")))
		})
	})
})
