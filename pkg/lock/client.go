package lock

import (
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// Scheme returns a scheme with what this package reads and writes:
// BuildLocks and BuildLockPolicies, grant Leases, events and
// SelfSubjectReviews.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(buildlockv1.AddToScheme(s))
	utilruntime.Must(corev1.AddToScheme(s))
	utilruntime.Must(coordinationv1.AddToScheme(s))
	utilruntime.Must(authenticationv1.AddToScheme(s))
	return s
}

// NewClient returns an API client for this package's functions, with
// Scheme.
func NewClient(cfg *rest.Config) (client.WithWatch, error) {
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		return nil, fmt.Errorf("creating the API client: %w", err)
	}
	return c, nil
}
