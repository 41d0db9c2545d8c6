// Package v1alpha1 contains the buildlock.io/v1alpha1 API: the BuildLock
// kind, one build's claim on one deploy target, and the BuildLockPolicy kind,
// how one lock chooses among its claims.
//
// +kubebuilder:object:generate=true
// +groupName=buildlock.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of every kind in this package.
	GroupVersion = schema.GroupVersion{Group: "buildlock.io", Version: "v1alpha1"}

	// SchemeBuilder registers this package's kinds with a runtime.Scheme.
	// It is apimachinery's, not controller-runtime's, so that packages which
	// only need the types (the arbiter's tests, the kubectl plugin) do not pull
	// in a controller framework.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds this package's kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, &BuildLock{}, &BuildLockList{}, &BuildLockPolicy{}, &BuildLockPolicyList{})
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
