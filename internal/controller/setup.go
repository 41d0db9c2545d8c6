package controller

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

// DefaultGrantRetention is how long a grant record remembers which builds of
// each line held, and how long the Lease of a lock without claims is kept,
// when Options.GrantRetention is not positive (--grant-retention).
const DefaultGrantRetention = 24 * time.Hour

// Options configure the operator: what cmd/manager's flags set, and what
// tests and the local control plane change. The zero value is a manager for
// tests: every namespace, no metrics or probe servers, no leader election,
// the real clock, finished claims kept.
type Options struct {
	// Namespaces to watch for BuildLocks; all when empty (--namespaces).
	Namespaces []string
	// FinishedTTL deletes terminal claims this long after they ended; zero
	// keeps them (--finished-ttl).
	FinishedTTL time.Duration
	// MaxHold bounds every hold of a lock whose BuildLockPolicy sets none;
	// zero means no bound (--max-hold).
	MaxHold time.Duration
	// GrantRetention: see DefaultGrantRetention (--grant-retention).
	GrantRetention time.Duration
	// MaxTimestampSkew is how far after its creation a claim's
	// spec.timestamp may place it; buildlockv1.MaxTimestampSkew when not
	// positive (--max-timestamp-skew).
	MaxTimestampSkew time.Duration
	// MaxBuildJump is how far above the highest build of its line that held
	// a claim that is not a person's may go; buildlockv1.DefaultMaxBuildJump
	// when not positive (--max-build-jump).
	MaxBuildJump int64
	// RequesterSettle: see DefaultRequesterSettle (tests shorten it).
	RequesterSettle time.Duration
	// Workers is how many locks are decided at once (default 4;
	// --max-concurrent-reconciles).
	Workers int

	// LeaderElection elects one deciding manager among replicas
	// (--leader-elect), with its Lease in LeaderElectionNamespace.
	LeaderElection          bool
	LeaderElectionNamespace string
	// LeaseDuration, RenewDeadline and RetryPeriod tune leader election
	// (controller-runtime's defaults when nil).
	LeaseDuration, RenewDeadline, RetryPeriod *time.Duration

	// MetricsBindAddress serves the metrics; "" or "0" serves none
	// (--metrics-bind-address). SecureMetrics serves them over HTTPS to
	// authenticated and authorized callers only (--metrics-secure), with
	// the certificate in MetricsCertDir or a self-signed one.
	MetricsBindAddress string
	SecureMetrics      bool
	MetricsCertDir     string
	// HealthProbeBindAddress serves /healthz and /readyz; "" or "0" serves
	// none (--health-probe-bind-address).
	HealthProbeBindAddress string

	// Clock defaults to the real clock; tests and chaos runs skew it.
	Clock clock.PassiveClock
	// Decide replaces the arbiter (to break it on purpose); nil uses it.
	Decide func(arbiter.Lock, []arbiter.Claim, arbiter.Grant, time.Time, arbiter.Policy) arbiter.Decision
	// NewClient builds the manager's client (tests wrap it to inject
	// faults); nil uses controller-runtime's.
	NewClient client.NewClientFunc
	// Registry receives the operator's metrics; controller-runtime's
	// global registry (the one the metrics server serves) when nil.
	Registry prometheus.Registerer
	// SkipNameValidation allows several managers in one process (tests).
	SkipNameValidation bool
}

// Scheme returns a scheme with the built-in kinds and buildlock's.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(buildlockv1.AddToScheme(s))
	return s
}

// NewManager returns a manager running the lock controller against cfg: the
// one wiring that cmd/manager, the tests, `make run` and `make demo` share.
// The caller starts it.
func NewManager(cfg *rest.Config, o Options) (ctrl.Manager, error) {
	if o.FinishedTTL < 0 || o.MaxHold < 0 || o.GrantRetention < 0 || o.MaxTimestampSkew < 0 || o.MaxBuildJump < 0 {
		return nil, fmt.Errorf("finished TTL, max hold, grant retention, max timestamp skew and max build jump must not be negative")
	}
	metricsOpts := metricsserver.Options{BindAddress: orDisabled(o.MetricsBindAddress)}
	if o.SecureMetrics {
		metricsOpts.SecureServing = true
		metricsOpts.CertDir = o.MetricsCertDir
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        Scheme(),
		Cache:                         CacheOptions(o.Namespaces),
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
	if err := Setup(mgr, o); err != nil {
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

// Setup registers the lock controller with mgr.
func Setup(mgr ctrl.Manager, o Options) error {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Registry == nil {
		o.Registry = metrics.Registry
	}
	if o.GrantRetention <= 0 {
		o.GrantRetention = DefaultGrantRetention
	}
	if o.MaxTimestampSkew <= 0 {
		o.MaxTimestampSkew = buildlockv1.MaxTimestampSkew
	}
	if o.MaxBuildJump <= 0 {
		o.MaxBuildJump = buildlockv1.DefaultMaxBuildJump
	}
	if o.RequesterSettle <= 0 {
		o.RequesterSettle = DefaultRequesterSettle
	}
	r := &LockReconciler{
		Client:           mgr.GetClient(),
		APIReader:        mgr.GetAPIReader(),
		Recorder:         mgr.GetEventRecorder("buildlock"),
		Clock:            o.Clock,
		MaxHold:          o.MaxHold,
		GrantRetention:   o.GrantRetention,
		MaxTimestampSkew: o.MaxTimestampSkew,
		MaxBuildJump:     o.MaxBuildJump,
		RequesterSettle:  o.RequesterSettle,
		FinishedTTL:      o.FinishedTTL,
		Decide:           o.Decide,
		Metrics:          NewMetrics(o.Registry),
		memory:           newLeaseMemory(),
	}
	r.Metrics.clock = o.Clock
	// Register every informer the controller watches or reads before the
	// manager starts, so that waiting for the cache to sync (readiness,
	// tests) covers them all (the admission policies' in setupFenceProber).
	for _, obj := range []client.Object{&buildlockv1.BuildLock{}, &buildlockv1.BuildLockPolicy{}, &coordinationv1.Lease{},
		&admissionv1.ValidatingAdmissionPolicyBinding{}, &corev1.Pod{}, namespaceMetadata()} {
		if _, err := mgr.GetCache().GetInformer(context.Background(), obj, cache.BlockUntilSynced(false)); err != nil {
			return fmt.Errorf("registering the informer of %T: %w", obj, err)
		}
	}
	if err := setupFenceProber(mgr, o, r); err != nil {
		return err
	}
	workers := o.Workers
	if workers <= 0 {
		workers = 4
	}
	if err := r.SetupWithManager(context.Background(), mgr, SetupOptions{
		MaxConcurrentReconciles: workers,
		SkipNameValidation:      o.SkipNameValidation,
	}); err != nil {
		return fmt.Errorf("setting up the lock controller: %w", err)
	}
	return nil
}

// SetupOptions tune the controller's registration with a manager.
type SetupOptions struct {
	// MaxConcurrentReconciles is how many locks are decided at once
	// (default 4). The workqueue never hands one lock to two workers.
	MaxConcurrentReconciles int
	// SkipNameValidation allows several managers in one process (tests).
	SkipNameValidation bool
}

// namespaceMetadata is the type under which namespaces are watched: their
// labels say whether a target consents to enforcement.
func namespaceMetadata() *metav1.PartialObjectMetadata {
	ns := &metav1.PartialObjectMetadata{}
	ns.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Namespace"))
	return ns
}

// CacheOptions returns the manager's cache settings: only the given
// namespaces (all when empty); pods reduced to their identity and phase, so
// that memory does not grow with unrelated pods' specs, labels and managed
// fields; and only buildlock's own Leases and bindings.
func CacheOptions(namespaces []string) cache.Options {
	ours := labels.SelectorFromSet(labels.Set{managedByLabel: managedByValue})
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

// SetupWithManager registers the indexes and watches of the lock controller:
// BuildLocks map to their lock; pods map to the locks of the claims that
// reference them; a BuildLockPolicy to the lock it is named after; a grant
// Lease that the cache lists when it starts, or that someone else than this
// manager creates, changes or deletes, to its lock (leaseHandler); a
// namespace whose buildlock.io/locked-by label changes, and an enforcement
// binding that was deleted, to the lock they concern.
func (r *LockReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, opts SetupOptions) error {
	indexer := mgr.GetFieldIndexer()
	if err := indexer.IndexField(ctx, &buildlockv1.BuildLock{}, targetField, func(obj client.Object) []string {
		return []string{obj.(*buildlockv1.BuildLock).Spec.Target}
	}); err != nil {
		return fmt.Errorf("indexing BuildLocks by %s: %w", targetField, err)
	}
	if err := indexer.IndexField(ctx, &buildlockv1.BuildLock{}, podRefField, func(obj client.Object) []string {
		if ref := obj.(*buildlockv1.BuildLock).Spec.PodRef; ref != nil {
			return []string{ref.Name}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("indexing BuildLocks by %s: %w", podRefField, err)
	}

	claimToLock := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		bl := obj.(*buildlockv1.BuildLock)
		return []reconcile.Request{lockRequest(bl.Namespace, bl.Spec.Target)}
	})
	podToLocks := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, pod client.Object) []reconcile.Request {
		var claims buildlockv1.BuildLockList
		if err := mgr.GetClient().List(ctx, &claims, client.InNamespace(pod.GetNamespace()), client.MatchingFields{podRefField: pod.GetName()}); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Listing claims of a pod", "pod", pod.GetName(), "namespace", pod.GetNamespace())
			return nil
		}
		reqs := make([]reconcile.Request, 0, len(claims.Items))
		for i := range claims.Items {
			if bl := &claims.Items[i]; !bl.Status.Phase.IsTerminal() {
				reqs = append(reqs, lockRequest(bl.Namespace, bl.Spec.Target))
			}
		}
		return reqs
	})
	policyToLock := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		return []reconcile.Request{lockRequest(obj.GetNamespace(), obj.GetName())}
	})
	// A namespace that consents (or stops consenting) to a lock's
	// enforcement changes that lock's Enforced condition; on an update the
	// map sees the old labels and the new.
	namespaceToLock := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		if owner := obj.GetLabels()[buildlockv1.LockedByLabel]; owner != "" {
			return []reconcile.Request{lockRequest(owner, obj.GetName())}
		}
		return nil
	})
	bindingToLock := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, obj client.Object) []reconcile.Request {
		if ns, target := obj.GetLabels()[claimsNamespaceLabel], obj.GetLabels()[targetLabel]; ns != "" && target != "" {
			return []reconcile.Request{lockRequest(ns, target)}
		}
		return nil
	})
	onlyDeletes := predicate.Funcs{
		CreateFunc:  func(event.CreateEvent) bool { return false },
		UpdateFunc:  func(event.UpdateEvent) bool { return false },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}

	return ctrl.NewControllerManagedBy(mgr).
		Named("buildlock").
		// Status-only updates are this controller's own writes: they need no
		// new decision. Spec changes (renewTime) bump the generation; a
		// force-release is an annotation.
		Watches(&buildlockv1.BuildLock{}, claimToLock, builder.WithPredicates(
			predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Watches(&corev1.Pod{}, podToLocks).
		Watches(&buildlockv1.BuildLockPolicy{}, policyToLock, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&coordinationv1.Lease{}, r.leaseHandler()).
		WatchesMetadata(&corev1.Namespace{}, namespaceToLock, builder.WithPredicates(predicate.LabelChangedPredicate{})).
		Watches(&admissionv1.ValidatingAdmissionPolicyBinding{}, bindingToLock, builder.WithPredicates(onlyDeletes)).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: max(1, opts.MaxConcurrentReconciles),
			SkipNameValidation:      ptr.To(opts.SkipNameValidation),
			NewQueue:                newFairQueue,
		}).
		Complete(r)
}

// lockRequest is the request that decides the lock of target in namespace.
func lockRequest(namespace, target string) reconcile.Request {
	return reconcile.Request{NamespacedName: types.NamespacedName{Namespace: namespace, Name: target}}
}
