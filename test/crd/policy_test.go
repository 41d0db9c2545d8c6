package crd_test

import (
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1alpha1 "github.com/buildlock/buildlock/api/v1alpha1"
)

const (
	msgPolicyName = "metadata.name must be the target this policy governs"
	msgMaxHold    = "spec.maxHold must be a duration between 1m and 168h, for example 2h"
)

// validPolicy is a BuildLockPolicy for target staging with no spec.
func validPolicy(namespace string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{}}}
	u.SetGroupVersionKind(buildlockv1alpha1.GroupVersion.WithKind("BuildLockPolicy"))
	u.SetNamespace(namespace)
	u.SetName("staging")
	return u
}

var _ = Describe("BuildLockPolicy validation", Label("validation"), func() {
	var namespace string

	BeforeEach(func() {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "policy-"}}
		Expect(k8sClient.Create(ctx, ns)).To(Succeed())
		namespace = ns.Name
	})

	create := func(m mutation) error {
		u := validPolicy(namespace)
		m(u)
		return k8sClient.Create(ctx, u)
	}

	DescribeTable("rejects a malformed BuildLockPolicy",
		func(m mutation, wants ...string) {
			err := create(m)
			GinkgoWriter.Printf("Rejected: %v\n", err)
			Expect(err).To(beInvalid(wants...))
		},
		Entry("named after no possible target (dots)", set("metadata.name", "staging.eu"), msgPolicyName),
		Entry("named after no possible target (64 characters)", set("metadata.name", strings.Repeat("a", 64)), msgPolicyName),
		Entry("with an unknown ordering", set("spec.ordering", "Random"), "spec.ordering", "Unsupported value", "NewestWins", "Queue", "Fifo"),
		Entry("with a lower-case ordering", set("spec.ordering", "queue"), "spec.ordering", "Unsupported value"),
		Entry("with a maxHold under a minute", set("spec.maxHold", "59s"), "spec.maxHold", msgMaxHold),
		Entry("with a maxHold over a week", set("spec.maxHold", "169h"), "spec.maxHold", msgMaxHold),
		Entry("with a maxHold in days", set("spec.maxHold", "1d"), "spec.maxHold", msgMaxHold),
		Entry("with a maxHold that overflows", set("spec.maxHold", "9999999999h"), "spec.maxHold", msgMaxHold),
		Entry("with a service account given as a user name", set("spec.enforce", map[string]any{"serviceAccounts": []any{"system:serviceaccount:ci:pipeline"}}),
			"spec.enforce.serviceAccounts", "must name service accounts of this namespace"),
		Entry("with unknown re-runs", set("spec.reruns", "Sometimes"), "spec.reruns", "Unsupported value", "Allowed", "Refused"),
		Entry("with unknown rollbacks", set("spec.rollbacks", "Pipelines"), "spec.rollbacks", "Unsupported value", "Anyone", "PeopleOnly", "Nobody"),
	)

	It("defaults re-runs to Allowed and rollbacks to Anyone", func() {
		Expect(create(func(*unstructured.Unstructured) {})).To(Succeed())
		var p buildlockv1alpha1.BuildLockPolicy
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "staging"}, &p)).To(Succeed())
		Expect(p.Spec.Reruns).To(Equal(buildlockv1alpha1.RerunsAllowed))
		Expect(p.Spec.Rollbacks).To(Equal(buildlockv1alpha1.RollbacksAnyone))
	})

	It("defaults the ordering to NewestWins and accepts every ordering and a maxHold", func() {
		Expect(create(func(*unstructured.Unstructured) {})).To(Succeed())
		var p buildlockv1alpha1.BuildLockPolicy
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "staging"}, &p)).To(Succeed())
		Expect(p.Spec.Ordering).To(Equal(buildlockv1alpha1.OrderingNewestWins))
		for _, ordering := range []string{"Queue", "Fifo", "NewestWins"} {
			u := validPolicy(namespace)
			u.SetName("t-" + strings.ToLower(ordering))
			set("spec.ordering", ordering)(u)
			set("spec.maxHold", "2h")(u)
			Expect(k8sClient.Create(ctx, u)).To(Succeed())
		}
	})
})
