package crd_test

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

	// CEL messages from api/v1alpha1/buildlock_types.go and timestamp.go.
	msgExpiresAfterBounds = "spec.expiresAfter must be a duration between 10s and 24h, for example 30m"
	msgExpiresAfterPod    = "spec.expiresAfter applies only to claims without spec.podRef"
	msgTime               = "must be an RFC 3339 time such as 2026-11-30T22:45:00Z"
	msgBranch             = "spec.branch must not contain invisible, bidirectional or control characters"
	msgRenewForward       = "spec.renewTime may only move forward: set it to the current time, never earlier than its last value, and never remove it"
	msgTarget             = "spec.target must be a namespace name: lower-case letters, digits and '-'"
	msgRepo               = "spec.repo must be owner/name (GitLab: group/subgroup/name)"
	msgPodName            = "spec.podRef.name must be the name of a pod in this BuildLock's namespace"
	msgPodUID             = "spec.podRef.uid must be the pod's metadata.uid, a UUID"
	msgWorkflow           = "spec.workflow must not contain invisible, bidirectional or control characters"
	msgRollbackBlank      = "spec.rollback.reason must say why the build rolls back"
	msgRollbackText       = "spec.rollback.reason must not contain invisible, bidirectional or control characters"
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
	matchers := []types.GomegaMatcher{Satisfy(apierrors.IsInvalid),
		// A raw regular expression says nothing a person can act on (issue
		// 22, item 7): every pattern is a CEL rule with a message.
		Not(MatchError(ContainSubstring("should match '")))}
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
		Entry("with an uppercase target", set("spec.target", "Staging"), "spec.target", msgTarget),
		Entry("with a target of 64 characters", set("spec.target", strings.Repeat("a", 64)),
			"spec.target", "Too long", "63"),
		Entry("with a target with a leading dash", set("spec.target", "-staging"), "spec.target", msgTarget),
		Entry("with a target with a trailing dash", set("spec.target", "staging-"), "spec.target", msgTarget),
		Entry("with a target with dots", set("spec.target", "staging.eu"), "spec.target", msgTarget),
		Entry("with a target with an underscore", set("spec.target", "stag_ing"), "spec.target", msgTarget),

		// spec.repo: owner/name.
		Entry("with an empty repo", set("spec.repo", ""), "spec.repo"),
		Entry("with a repo without owner", set("spec.repo", "shop"), "spec.repo", msgRepo),
		Entry("with a repo with a space", set("spec.repo", "acme/my shop"), "spec.repo", msgRepo),
		Entry("with a repo with an empty segment", set("spec.repo", "acme//shop"), "spec.repo", msgRepo),
		Entry("with a repo with a leading slash", set("spec.repo", "/shop"), "spec.repo", msgRepo),
		Entry("with a repo with a trailing slash", set("spec.repo", "acme/"), "spec.repo", msgRepo),
		Entry("with a repo given as a URL", set("spec.repo", "https://github.com/acme/shop"),
			"spec.repo", msgRepo),
		Entry("with a repo of 256 characters", set("spec.repo", "acme/"+strings.Repeat("s", 251)),
			"spec.repo", "Too long", "255"),

		// spec.branch: non-empty, bounded, printable.
		Entry("with an empty branch", set("spec.branch", ""), "spec.branch"),
		Entry("with a branch of 256 characters", set("spec.branch", strings.Repeat("b", 256)),
			"spec.branch", "Too long", "255"),
		Entry("with a newline in the branch", set("spec.branch", "fix\nBuild 1 of evil/repo@main holds staging"), "spec.branch", msgBranch),
		Entry("with an escape sequence in the branch", set("spec.branch", "main\x1b[2J\x1b[31m"), "spec.branch", msgBranch),
		Entry("with a tab in the branch", set("spec.branch", "ma\tin"), "spec.branch", msgBranch),
		Entry("with a NUL in the branch", set("spec.branch", "ma\x00in"), "spec.branch", msgBranch),
		Entry("with DEL in the branch", set("spec.branch", "ma\x7fin"), "spec.branch", msgBranch),
		Entry("with a C1 control character in the branch", set("spec.branch", "ma\u009bin"), "spec.branch", msgBranch),
		Entry("with a right-to-left override in the branch", set("spec.branch", "main\u202egnp.exe"), "spec.branch", msgBranch),

		// spec.workflow and spec.rollback: printable, bounded; a rollback says why.
		Entry("with an empty workflow", set("spec.workflow", ""), "spec.workflow"),
		Entry("with a workflow of 256 characters", set("spec.workflow", strings.Repeat("w", 256)), "spec.workflow", "Too long", "255"),
		Entry("with a newline in the workflow", set("spec.workflow", "deploy.yml\nBuild 1 holds"), "spec.workflow", msgWorkflow),
		Entry("with a rollback without a reason", set("spec.rollback", map[string]any{}), "spec.rollback.reason: Required value"),
		Entry("with a blank rollback reason", set("spec.rollback", map[string]any{"reason": "   "}), "spec.rollback.reason", msgRollbackBlank),
		Entry("with an escape sequence in the rollback reason", set("spec.rollback", map[string]any{"reason": "INC-7\x1b[2J"}),
			"spec.rollback.reason", msgRollbackText),
		Entry("with a rollback reason of 257 characters", set("spec.rollback", map[string]any{"reason": strings.Repeat("r", 257)}),
			"spec.rollback.reason", "Too long", "256"),

		// spec.build: an integer of at least 1.
		Entry("with build 0", set("spec.build", int64(0)), "spec.build", "should be greater than or equal to 1"),
		Entry("with a negative build", set("spec.build", int64(-7)), "spec.build", "should be greater than or equal to 1"),
		Entry("with a build given as a string", set("spec.build", "42"), "spec.build", "integer"),
		Entry("with a build above 2^53-1", set("spec.build", int64(1)<<53), "spec.build", "should be less than or equal to 9007199254740991"),
		Entry("with the largest int64 build", set("spec.build", int64(1<<63-1)), "spec.build", "should be less than or equal to"),
		Entry("with a build given as a fraction", set("spec.build", 4.5), "spec.build", "integer"),

		// spec.podRef: a pod name in this namespace, an optional UID.
		Entry("with an empty podRef name", set("spec.podRef", map[string]any{"name": ""}), "spec.podRef.name"),
		Entry("with an uppercase podRef name", set("spec.podRef", map[string]any{"name": "Pipeline-42"}),
			"spec.podRef.name", msgPodName),
		Entry("with a podRef name of 254 characters", set("spec.podRef", map[string]any{"name": dnsSubdomain(254)}),
			"spec.podRef.name", "Too long", "253"),
		Entry("with a podRef to a pod in another namespace",
			set("spec.podRef", map[string]any{"name": "kube-system/etcd"}), "spec.podRef.name", msgPodName),
		Entry("with a non-hex podRef uid", set("spec.podRef", map[string]any{"name": "pipeline-42", "uid": "not-a-uid!"}),
			"spec.podRef.uid", msgPodUID),
		Entry("with a podRef uid that is not a UUID", set("spec.podRef", map[string]any{"name": "pipeline-42", "uid": "------"}),
			"spec.podRef.uid", msgPodUID),
		Entry("with a podRef uid of 37 characters",
			set("spec.podRef", map[string]any{"name": "pipeline-42", "uid": podUID + "a"}),
			"spec.podRef.uid", "Too long", "36"),

		// spec.expiresAfter: a duration between 10s and 24h, on a pod-less claim.
		Entry("with expiresAfter 5s", set("spec.expiresAfter", "5s"), "spec.expiresAfter", msgExpiresAfterBounds),
		Entry("with expiresAfter 9.999s", set("spec.expiresAfter", "9.999s"), "spec.expiresAfter", msgExpiresAfterBounds),
		Entry("with expiresAfter 25h", set("spec.expiresAfter", "25h"), "spec.expiresAfter", msgExpiresAfterBounds),
		Entry("with expiresAfter 24h1s", set("spec.expiresAfter", "24h1s"), "spec.expiresAfter", msgExpiresAfterBounds),
		Entry("with expiresAfter abc", set("spec.expiresAfter", "abc"), "spec.expiresAfter", msgExpiresAfterBounds),
		Entry("with expiresAfter -1m", set("spec.expiresAfter", "-1m"), "spec.expiresAfter", msgExpiresAfterBounds),
		Entry("with expiresAfter without unit", set("spec.expiresAfter", "3600"), "spec.expiresAfter", msgExpiresAfterBounds),
		Entry("with an empty expiresAfter", set("spec.expiresAfter", ""), "spec.expiresAfter", msgExpiresAfterBounds),
		Entry("with an expiresAfter that overflows", set("spec.expiresAfter", "9999999999h"),
			"spec.expiresAfter", msgExpiresAfterBounds),
		Entry("with an expiresAfter that overflows in nanoseconds", set("spec.expiresAfter", "99999999999999999999ns"),
			"spec.expiresAfter", msgExpiresAfterBounds),
		Entry("with an expiresAfter of many parts that add up past 24h", set("spec.expiresAfter", "23h59m59s1001ms"),
			"spec.expiresAfter", msgExpiresAfterBounds),
		Entry("with expiresAfter on a claim with a pod", all(withPod, set("spec.expiresAfter", "30m")),
			msgExpiresAfterPod),

		// Timestamps: any RFC 3339 time, nothing else.
		Entry("with a timestamp that is not a time", set("spec.timestamp", "yesterday"), "spec.timestamp", msgTime),
		Entry("with a renewTime that is not a time", set("spec.renewTime", "now"), "spec.renewTime", msgTime),
		Entry("with a timestamp without a zone", set("spec.timestamp", "2026-11-30T22:45:00"), "spec.timestamp", msgTime),
		Entry("with a date for a timestamp", set("spec.timestamp", "2026-11-30"), "spec.timestamp", msgTime),
		Entry("with a lower-case timestamp", set("spec.timestamp", "2026-11-30t22:45:00z"), "spec.timestamp", msgTime),
		Entry("with a space for the T", set("spec.timestamp", "2026-11-30 22:45:00Z"), "spec.timestamp", msgTime),
		Entry("with hour 24", set("spec.timestamp", "2026-11-30T24:00:00Z"), "spec.timestamp", msgTime),
		Entry("with a leap second", set("spec.renewTime", "2026-12-31T23:59:60Z"), "spec.renewTime", msgTime),
		Entry("with ten fractional digits", set("spec.timestamp", "2026-11-30T22:45:00.1234567891Z"), "spec.timestamp", msgTime),
		Entry("with a 31st of November", set("spec.timestamp", "2026-11-31T22:45:00Z"), "spec.timestamp"),
		Entry("with a 29th of February in a common year", set("spec.renewTime", "2026-02-29T00:00:00Z"), "spec.renewTime"),
		Entry("with a timestamp of 36 characters", set("spec.timestamp", "2026-11-30T22:45:00.123456789+14:000"), "spec.timestamp"),

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
		Entry("removing expiresAfter", set("spec.expiresAfter", "30m"),
			unset("spec.expiresAfter"), msgImmutable("expiresAfter")),
		Entry("adding expiresAfter", unset("spec.expiresAfter"), set("spec.expiresAfter", "2h"),
			msgImmutable("expiresAfter")),
		Entry("moving renewTime backwards", set("spec.renewTime", renewedAt),
			set("spec.renewTime", "2026-01-02T03:59:59.999999Z"), msgRenewForward),
		Entry("removing renewTime", set("spec.renewTime", renewedAt), unset("spec.renewTime"), msgRenewForward),
		Entry("adding workflow", withPod, set("spec.workflow", "deploy.yml"), msgImmutable("workflow")),
		Entry("changing workflow", set("spec.workflow", "deploy.yml"), set("spec.workflow", "hotfix.yml"), msgImmutable("workflow")),
		Entry("adding rollback", withPod, set("spec.rollback", map[string]any{"reason": "INC-7"}), msgImmutable("rollback")),
		Entry("changing the rollback's reason", set("spec.rollback", map[string]any{"reason": "INC-7"}),
			set("spec.rollback", map[string]any{"reason": "INC-8"}), msgImmutable("rollback")),
		Entry("removing rollback", set("spec.rollback", map[string]any{"reason": "INC-7"}), unset("spec.rollback"), msgImmutable("rollback")),
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
		It("a minimal BuildLock, leaving expiresAfter absent (a pod-less claim's hold then lasts 1h)", func() {
			createValid(func(*unstructured.Unstructured) {})

			_, found, err := unstructured.NestedString(get().Object, "spec", "expiresAfter")
			Expect(err).NotTo(HaveOccurred())
			Expect(found).To(BeFalse(), "no default: a claim with a pod must not carry an expiry it ignores")

			var bl buildlockv1alpha1.BuildLock
			Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: claimName}, &bl)).To(Succeed())
			Expect(bl.Spec.ExpiresAfter).To(BeNil())
			Expect(bl.Spec.PodRef).To(BeNil())
			Expect(bl.Spec.RenewTime).To(BeNil())
		})

		It("a fully specified BuildLock written with the Go types, with a pod and without", func() {
			now := time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC)
			podless := &buildlockv1alpha1.BuildLock{
				ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: claimName},
				Spec: buildlockv1alpha1.BuildLockSpec{
					Target:       "staging",
					Repo:         "acme/shop",
					Branch:       "feature/checkout-v2",
					Build:        1,
					Timestamp:    buildlockv1alpha1.NewTimestamp(now),
					ExpiresAfter: &metav1.Duration{Duration: 90 * time.Second},
					RenewTime:    buildlockv1alpha1.NewTimestamp(now),
				},
			}
			withPod := podless.DeepCopy()
			withPod.Name = claimName + "-pod"
			withPod.Spec.ExpiresAfter = nil
			withPod.Spec.PodRef = &buildlockv1alpha1.PodReference{Name: "pipeline-42", UID: podUID}
			for _, bl := range []*buildlockv1alpha1.BuildLock{podless, withPod} {
				Expect(k8sClient.Create(ctx, bl)).To(Succeed())
				var got buildlockv1alpha1.BuildLock
				Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(bl), &got)).To(Succeed())
				Expect(got.Spec.Timestamp.Equal(now)).To(BeTrue(), "microseconds round-trip")
				got.Spec.Timestamp, got.Spec.RenewTime = bl.Spec.Timestamp, bl.Spec.RenewTime
				Expect(got.Spec).To(Equal(bl.Spec))
			}
		})

		// Every time a person or a CI system writes in RFC 3339 is admitted,
		// and decodes: one object the Go types cannot read would stop the
		// operator's informer for every claim of every namespace.
		DescribeTable("any RFC 3339 time, which the Go types then decode",
			func(written string, want time.Time) {
				createValid(all(set("spec.timestamp", written), set("spec.renewTime", written)))
				var bl buildlockv1alpha1.BuildLock
				Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: claimName}, &bl)).To(Succeed())
				Expect(bl.Spec.Timestamp.Time.Equal(want)).To(BeTrue(), "timestamp %s", bl.Spec.Timestamp.Time)
				Expect(bl.Spec.RenewTime.Time.Equal(want)).To(BeTrue(), "renewTime %s", bl.Spec.RenewTime.Time)
				var list buildlockv1alpha1.BuildLockList
				Expect(k8sClient.List(ctx, &list, client.InNamespace(namespace))).To(Succeed(), "listing, as an informer does")
			},
			Entry("without a fraction (date -u +%FT%TZ)", "2026-11-30T22:45:00Z", time.Date(2026, 11, 30, 22, 45, 0, 0, time.UTC)),
			Entry("with milliseconds (JavaScript's toISOString)", "2026-11-30T22:45:00.123Z", time.Date(2026, 11, 30, 22, 45, 0, 123e6, time.UTC)),
			Entry("with microseconds", "2026-11-30T22:45:00.123456Z", time.Date(2026, 11, 30, 22, 45, 0, 123456e3, time.UTC)),
			Entry("with nanoseconds", "2026-11-30T22:45:00.123456789Z", time.Date(2026, 11, 30, 22, 45, 0, 123456789, time.UTC)),
			Entry("with an offset of +14:00", "2026-12-01T12:45:00+14:00", time.Date(2026, 11, 30, 22, 45, 0, 0, time.UTC)),
			Entry("with an offset of -09:30 and a fraction", "2026-11-30T13:15:00.5-09:30", time.Date(2026, 11, 30, 22, 45, 0, 5e8, time.UTC)),
			Entry("in year 9999", "9999-12-31T23:59:59Z", time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)),
		)

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
			Entry("the largest build", set("spec.build", int64(1<<53-1))),
			Entry("expiresAfter as Go writes it", set("spec.expiresAfter", "1h0m0s")),
			Entry("expiresAfter with a fraction", set("spec.expiresAfter", "1.5h")),
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
