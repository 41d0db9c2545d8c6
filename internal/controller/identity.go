package controller

import (
	"context"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/types"
)

// requesterPolicyName names the MutatingAdmissionPolicy that stamps every
// new BuildLock's spec.requester with the identity that creates it, and its
// binding (config/enforcement/requester.yaml).
const requesterPolicyName = "buildlock-requester"

// DefaultRequesterSettle is how long after the buildlock-requester policy
// and its binding were created the operator takes spec.requester as the API
// server's word, when Options.RequesterSettle is not positive: a new
// admission policy takes effect a moment after it is created (the API
// server loads and compiles it), and a claim created before could carry a
// requester its client wrote.
const DefaultRequesterSettle = 30 * time.Second

// requestersVerifiedSince returns the instant after which a claim's
// spec.requester is the API server's word: RequesterSettle after the later
// of the creation of the buildlock-requester MutatingAdmissionPolicy and of
// its binding, while both exist. Zero when either is missing or cannot be
// read, or the cluster has no MutatingAdmissionPolicies: spec.requester is
// then a client's word, and claims have no Identity (arbiter.Claim). Read
// from the cache: a policy deleted a moment ago may still count, for the
// informer's lag.
func (r *LockReconciler) requestersVerifiedSince(ctx context.Context) time.Time {
	if !r.verifyRequesters {
		return time.Time{}
	}
	var policy admissionv1.MutatingAdmissionPolicy
	if err := r.Client.Get(ctx, types.NamespacedName{Name: requesterPolicyName}, &policy); err != nil {
		return time.Time{}
	}
	var binding admissionv1.MutatingAdmissionPolicyBinding
	if err := r.Client.Get(ctx, types.NamespacedName{Name: requesterPolicyName}, &binding); err != nil {
		return time.Time{}
	}
	since := policy.CreationTimestamp.Time
	if b := binding.CreationTimestamp.Time; b.After(since) {
		since = b
	}
	return since.Add(r.RequesterSettle)
}
