package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// The workload's actors (the people, the windows, the CI jobs, the
// rollbacks) call the API servers while the run kills and restarts them.
// Every call that fails is judged here, in one place, so that a failure of
// the moment (an API server restarting, its discovery failing, a 5xx, a
// 429, a connection reset, refused or cut, a timeout, the run's own end)
// is retried or counted, and only a refusal by the wrong authority (RBAC
// where admission should refuse, say) is taken for a broken setup.

// callClass is how a call ended.
type callClass int

const (
	// callDone: it succeeded.
	callDone callClass = iota
	// callStopped: the run's own context ended (the run stopping its
	// actors at its end): neither a success nor a failure.
	callStopped
	// callTransient: the API could not answer for a moment: discovery
	// failed, a 5xx or 429, the connection was refused, reset or cut, the
	// call timed out; or an API server that just started refused it before
	// its authorizer or its admission policies caught up.
	callTransient
	// callRefused: an API server answered no: Forbidden (by whom: see
	// callResult.by), a conflict, not found, invalid, already exists...
	callRefused
	// callUnexplained: none of the above (counted, with the error).
	callUnexplained
)

// Who refuses a Forbidden call.
const (
	byRBAC = "RBAC"
	// byStarting: an API server whose admission policies are not loaded yet
	// ("not yet ready to handle request").
	byStarting = "an API server starting"
)

// callResult is a judged call.
type callResult struct {
	class callClass
	// by is who refused a Forbidden call: the admission policy's name (of
	// a ValidatingAdmissionPolicy), "webhook <name>", byRBAC, byStarting,
	// or "" when the message does not say.
	by string
	// why says in a few words what happened, for the figures.
	why string
	err error
}

// refusedBy reports whether the call was refused (Forbidden) by the
// admission policy whose name starts with policy.
func (r callResult) refusedBy(policy string) bool {
	return r.class == callRefused && apierrors.IsForbidden(r.err) && strings.HasPrefix(r.by, policy)
}

// wrongAuthority reports whether the call was refused (Forbidden) by
// someone other than the admission policy whose name starts with policy:
// the run is set up wrong (RBAC refuses what admission should judge).
// Refusals of a moment (callTransient) are not.
func (r callResult) wrongAuthority(policy string) bool {
	return r.class == callRefused && apierrors.IsForbidden(r.err) && !strings.HasPrefix(r.by, policy)
}

// classifyCall judges how a call that returned err ended. ctx is the
// caller's context (the run's); steady says whether every API server and
// etcd answered throughout the call and a while before it (see
// Checker.ControlPlaneSteady): a refusal by RBAC, or by an API server
// still loading its admission policies, is then a refusal, else a
// moment's.
func classifyCall(ctx context.Context, err error, steady bool) callResult {
	r := callResult{err: err}
	var status apierrors.APIStatus
	isStatus := errors.As(err, &status)
	switch {
	case err == nil:
		r.class, r.why = callDone, "done"
	case ctx.Err() != nil && (!isStatus || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		r.class, r.why = callStopped, "the run ended"
	case isDiscoveryFailure(err):
		// Before its status: a discovery that an API server starting
		// refuses (403) says nothing of the call, which was never sent.
		r.class, r.why = callTransient, "discovery failed"
	case apierrors.IsTooManyRequests(err):
		r.class, r.why = callTransient, "429 TooManyRequests"
	case isStatus && status.Status().Code >= 500, apierrors.IsServerTimeout(err), apierrors.IsTimeout(err), apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err):
		r.class, r.why = callTransient, "5xx "+string(apierrors.ReasonForError(err))
	case apierrors.IsForbidden(err):
		r.by = refuser(err)
		r.class, r.why = callRefused, "Forbidden"
		if r.by != "" {
			r.why += " by " + r.by
		}
		if !steady && (r.by == byRBAC || r.by == byStarting) {
			r.class, r.why = callTransient, r.why+" while an API server restarted"
		}
	case isStatus:
		r.class, r.why = callRefused, string(apierrors.ReasonForError(err))
		if r.why == "" || r.why == string(metav1.StatusReasonUnknown) {
			r.why = "refused"
		}
	case isConnectionFailure(err):
		r.class, r.why = callTransient, "connection failed"
	case utilnet.IsTimeout(err), errors.Is(err, context.DeadlineExceeded):
		r.class, r.why = callTransient, "timed out"
	default:
		r.class, r.why = callUnexplained, "error"
	}
	return r
}

// isDiscoveryFailure reports whether err is the client's discovery of the
// API's groups and resources failing (which controller-runtime's REST
// mapper wraps with these words), or a kind the discovery of an API
// server that just started does not serve yet.
func isDiscoveryFailure(err error) bool {
	var resources *apiutil.ErrResourceDiscoveryFailed
	msg := err.Error()
	return errors.As(err, &resources) || discovery.IsGroupDiscoveryFailedError(err) || meta.IsNoMatchError(err) ||
		strings.Contains(msg, "failed to get server groups") || strings.Contains(msg, "failed to get API group resources")
}

// isConnectionFailure reports whether err is a connection refused, reset,
// closed or cut before an answer.
func isConnectionFailure(err error) bool {
	return utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err) || utilnet.IsHTTP2ConnectionLost(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}

// refuser reads who refused a Forbidden call from its message.
func refuser(err error) string {
	msg := err.Error()
	if _, rest, ok := strings.Cut(msg, "ValidatingAdmissionPolicy '"); ok {
		name, _, _ := strings.Cut(rest, "'")
		return name
	}
	if _, rest, ok := strings.Cut(msg, `admission webhook "`); ok {
		name, _, _ := strings.Cut(rest, `"`)
		return "webhook " + name
	}
	switch {
	case strings.Contains(msg, "not yet ready to handle request"):
		return byStarting
	case strings.Contains(msg, `User "`) && strings.Contains(msg, " cannot "):
		return byRBAC
	}
	return ""
}

// retryable reports whether a call that ended so is worth sending again: a
// failure of the moment, or a refusal by RBAC, which an API server just
// started sends until its authorizer has caught up.
func (r callResult) retryable() bool {
	return r.class == callTransient || r.class == callRefused && (r.by == byRBAC || r.by == byStarting)
}

// retryFor is how long retry sends a call again; steadyFor how long the
// control plane must have answered before and during a call for a refusal
// by RBAC to count as one (retryFor, and a few seconds for the call).
const (
	retryFor  = 10 * time.Second
	steadyFor = retryFor + 5*time.Second
)

// retry calls do until it succeeds or fails for good (see retryable), for
// up to retryFor, and returns its last error.
func retry(ctx context.Context, do func() error) error {
	deadline := time.Now().Add(retryFor)
	for {
		err := do()
		if !classifyCall(ctx, err, true).retryable() || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// classify judges a call of the run's actors that returned err, with the
// control plane's state as the checker was told of it.
func (h *harness) classify(ctx context.Context, err error) callResult {
	return classifyCall(ctx, err, h.check.ControlPlaneSteady(steadyFor))
}

// TestClassifyCall: every class of failure the actors meet, each a case of
// its own, so that removing any one from classifyCall fails it.
func TestClassifyCall(t *testing.T) {
	live, ended := context.Background(), func() context.Context {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx
	}()
	claims := schema.GroupResource{Group: "buildlock.io", Resource: "buildlocks"}
	forbidden := func(gr schema.GroupResource, why string) error {
		return apierrors.NewForbidden(gr, "x", errors.New(why))
	}
	policyRefusal := forbidden(claims, "ValidatingAdmissionPolicy 'buildlock-override' with binding 'buildlock-override' denied request: pipelines may not override")
	rbacRefusal := forbidden(schema.GroupResource{Resource: "namespaces"}, `User "system:serviceaccount:chaos-0:pipeline" cannot patch resource "namespaces" in API group "" in the namespace "x"`)
	starting := forbidden(claims, "not yet ready to handle request")
	urlErr := func(err error) error {
		return &url.Error{Op: "Patch", URL: "https://127.0.0.1:6443/api/v1/namespaces/x", Err: err}
	}
	dial := func(errno syscall.Errno) error {
		return urlErr(&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", errno)})
	}
	cases := []struct {
		name   string
		ctx    context.Context
		err    error
		steady bool
		want   callClass
		by     string
	}{
		{"done", live, nil, true, callDone, ""},
		{"the run's end canceled the call", ended, urlErr(context.Canceled), true, callStopped, ""},
		{"a refusal that came before the run's end", ended, policyRefusal, true, callRefused, "buildlock-override"},
		{"discovery refused by an API server starting (failed to get server groups: unknown)", live,
			fmt.Errorf("failed to get server groups: %w", apierrors.NewGenericServerResponse(http.StatusForbidden, "GET", schema.GroupResource{}, "", "unknown", 0, true)), true, callTransient, ""},
		{"discovery of a group version failed", live,
			&apiutil.ErrResourceDiscoveryFailed{schema.GroupVersion{Group: "buildlock.io", Version: "v1alpha1"}: errors.New("boom")}, true, callTransient, ""},
		{"a kind not served yet", live, &meta.NoKindMatchError{GroupKind: schema.GroupKind{Group: "buildlock.io", Kind: "BuildLock"}}, true, callTransient, ""},
		{"500", live, apierrors.NewInternalError(errors.New("etcdserver: leader changed")), true, callTransient, ""},
		{"503", live, apierrors.NewServiceUnavailable("the server is currently unable to handle the request"), true, callTransient, ""},
		{"504", live, apierrors.NewTimeoutError("request did not complete within the allowed duration", 0), true, callTransient, ""},
		{"429", live, apierrors.NewTooManyRequests("slow down", 1), true, callTransient, ""},
		{"connection refused", live, dial(syscall.ECONNREFUSED), true, callTransient, ""},
		{"connection reset", live, urlErr(&net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}), true, callTransient, ""},
		{"EOF", live, urlErr(io.EOF), true, callTransient, ""},
		{"http2 connection lost", live, urlErr(errors.New("http2: client connection lost")), true, callTransient, ""},
		{"the client's timeout", live, urlErr(context.DeadlineExceeded), true, callTransient, ""},
		{"refused by the admission policy", live, policyRefusal, true, callRefused, "buildlock-override"},
		{"refused by RBAC", live, rbacRefusal, true, callRefused, byRBAC},
		{"refused by RBAC while an API server restarted", live, rbacRefusal, false, callTransient, byRBAC},
		{"refused by an API server loading its policies, while it restarted", live, starting, false, callTransient, byStarting},
		{"a conflict", live, apierrors.NewConflict(claims, "x", errors.New("the object has been modified")), true, callRefused, ""},
		{"not found", live, apierrors.NewNotFound(claims, "x"), true, callRefused, ""},
		{"something else", live, errors.New("x509: certificate signed by unknown authority"), true, callUnexplained, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := classifyCall(tc.ctx, tc.err, tc.steady)
			if r.class != tc.want || r.by != tc.by {
				t.Errorf("classifyCall(%v, steady %t) = class %d by %q (%s); want class %d by %q", tc.err, tc.steady, r.class, r.by, r.why, tc.want, tc.by)
			}
		})
	}

	// What the actors conclude from them.
	if r := classifyCall(live, policyRefusal, true); !r.refusedBy("buildlock-override") || r.wrongAuthority("buildlock-override") {
		t.Errorf("a refusal by buildlock-override: refusedBy %t, wrongAuthority %t", r.refusedBy("buildlock-override"), r.wrongAuthority("buildlock-override"))
	}
	if r := classifyCall(live, rbacRefusal, true); !r.wrongAuthority("buildlock-") {
		t.Error("a refusal by RBAC in a steady control plane is not the wrong authority")
	}
	for _, err := range []error{rbacRefusal, fmt.Errorf("failed to get server groups: %w", rbacRefusal)} {
		if r := classifyCall(live, err, false); r.wrongAuthority("buildlock-") {
			t.Errorf("%v while an API server restarted: the wrong authority", err)
		}
	}
	if r := classifyCall(ended, urlErr(context.Canceled), true); r.wrongAuthority("buildlock-override") || r.retryable() {
		t.Error("a call the run's end canceled: the wrong authority, or retried")
	}
	if !classifyCall(live, rbacRefusal, true).retryable() || !classifyCall(live, dial(syscall.ECONNREFUSED), true).retryable() || classifyCall(live, policyRefusal, true).retryable() {
		t.Error("retryable: want RBAC refusals and transient failures retried, admission's refusals not")
	}
}
