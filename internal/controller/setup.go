package controller

import (
	"context"
	"fmt"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/controller/admission"
	"github.com/buildlock/buildlock/internal/controller/cleanup"
	"github.com/buildlock/buildlock/internal/controller/grant"
	"github.com/buildlock/buildlock/internal/controller/policy"
)

// Scheme returns a scheme with the built-in kinds and buildlock's.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(buildlockv1.AddToScheme(s))
	return s
}

// NewManager returns a manager running the operator's controllers against
// cfg, configured by o (see Options): the one wiring that cmd/manager, the
// tests, `make run` and `make demo` share. The caller starts it.
func NewManager(cfg *rest.Config, o Options) (ctrl.Manager, error) {
	o, err := o.complete()
	if err != nil {
		return nil, err
	}
	metricsOpts := metricsserver.Options{BindAddress: orDisabled(o.MetricsBindAddress)}
	if o.SecureMetrics {
		metricsOpts.SecureServing = true
		metricsOpts.CertDir = o.MetricsCertDir
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        Scheme(),
		Cache:                         cacheOptions(o.Namespaces),
		NewClient:                     o.NewClient,
		Metrics:                       metricsOpts,
		HealthProbeBindAddress:        orDisabled(o.HealthProbeBindAddress),
		LeaderElection:                o.LeaderElection,
		LeaderElectionID:              "buildlock-manager.buildlock.io",
		LeaderElectionNamespace:       o.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 o.LeaseDuration,
		RenewDeadline:                 o.RenewDeadline,
		RetryPeriod:                   o.RetryPeriod,
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	if err := setupControllers(mgr, o); err != nil {
		return nil, err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, fmt.Errorf("adding healthz check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return nil, fmt.Errorf("adding readyz check: %w", err)
	}
	return mgr, nil
}

func orDisabled(addr string) string {
	if addr == "" {
		return "0"
	}
	return addr
}

// setupControllers registers the operator's controllers with mgr: the lock
// reconciler, the policy controller, and the garbage collections (the
// finished claims' only with a finished TTL). They share the manager's
// memory of the Leases and what is known of the admission policies.
func setupControllers(mgr ctrl.Manager, o Options) error {
	// Register every informer the controllers watch or read before the
	// manager starts, so that waiting for the cache to sync (readiness,
	// tests) covers them all (the policy controller's and the admission
	// policies' are registered by them).
	if err := registerInformers(mgr, &buildlockv1.BuildLock{}, &buildlockv1.BuildLockPolicy{}, &coordinationv1.Lease{}, &corev1.Pod{}); err != nil {
		return err
	}
	policies, err := admission.Watch(mgr)
	if err != nil {
		return err
	}
	memory := grant.NewMemory()
	metrics := NewMetrics(o.Registry)
	metrics.clock = o.Clock
	obs := observer{cache: mgr.GetClient(), apiReader: mgr.GetAPIReader(), admission: policies,
		requesterSettle: o.RequesterSettle, defaults: o.arbiterDefaults(), deleted: newDeletions(), memory: memory, own: newOwnStatuses()}
	dec := decider{observer: obs, memory: memory, admission: policies, arbiter: o.Decide, clock: o.Clock}
	r := &lockReconciler{
		clock:    o.Clock,
		observer: obs,
		decider:  dec,
		granter:  granter{client: mgr.GetClient(), live: mgr.GetAPIReader(), memory: memory, decider: dec, metrics: metrics},
		statuses: statusWriter{client: mgr.GetClient(), own: obs.own, recorder: mgr.GetEventRecorder("buildlock"), metrics: metrics},
		metrics:  metrics,
	}
	if err := setupLockReconciler(mgr, r, memory, o.Workers, o.SkipNameValidation); err != nil {
		return err
	}
	if err := (&policy.Reconciler{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Namespaces: o.Namespaces, Clock: o.Clock,
		Admission: policies, Defaults: o.arbiterDefaults(), Registry: o.Registry, SkipNameValidation: o.SkipNameValidation,
		Recorder: mgr.GetEventRecorder("buildlock"),
	}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&cleanup.IdleLeases{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Memory: memory, Clock: o.Clock,
		Retention: o.GrantRetention, SkipNameValidation: o.SkipNameValidation,
	}).SetupWithManager(mgr); err != nil {
		return err
	}
	if o.FinishedTTL <= 0 {
		return nil
	}
	return (&cleanup.FinishedClaims{
		Client: mgr.GetClient(), Clock: o.Clock, FinishedTTL: o.FinishedTTL, SkipNameValidation: o.SkipNameValidation,
	}).SetupWithManager(mgr)
}

// registerInformers registers the informers of objs with mgr's cache.
func registerInformers(mgr ctrl.Manager, objs ...client.Object) error {
	for _, obj := range objs {
		if _, err := mgr.GetCache().GetInformer(context.Background(), obj, cache.BlockUntilSynced(false)); err != nil {
			return fmt.Errorf("registering the informer of %T: %w", obj, err)
		}
	}
	return nil
}

// cacheOptions returns the manager's cache settings: only the given
// namespaces (all when empty); pods watched whole but kept reduced to their
// identity and phase (stripPod), so that memory does not grow with the
// pods' specs, labels and managed fields (one small entry per pod of the
// watched namespaces remains); and only buildlock's own Leases and
// bindings.
func cacheOptions(namespaces []string) cache.Options {
	ours := labels.SelectorFromSet(labels.Set{grant.ManagedByLabel: grant.ManagedByValue})
	opts := cache.Options{
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}:           {Transform: stripPod},
			&coordinationv1.Lease{}: {Label: ours},
			&admissionv1.ValidatingAdmissionPolicyBinding{}: {Label: ours},
		},
	}
	if len(namespaces) > 0 {
		opts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range namespaces {
			opts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	return opts
}

// stripPod keeps only what the controller needs of a pod: its identity and
// its phase. So the cache holds a few hundred bytes per pod of the cluster,
// not whole pods, and deciding a lock reads no pod live unless the cache
// cannot say it is gone for sure.
func stripPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &corev1.Pod{
		TypeMeta: pod.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID,
			ResourceVersion: pod.ResourceVersion, DeletionTimestamp: pod.DeletionTimestamp,
		},
		Status: corev1.PodStatus{Phase: pod.Status.Phase},
	}, nil
}
