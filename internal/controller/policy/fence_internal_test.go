package policy

import (
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
	"github.com/buildlock/buildlock/internal/controller/grant"
)

func TestReadProbe(t *testing.T) {
	lock := arbiter.Lock{Namespace: "ci", Target: "staging"}
	leases := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	refusal := func(binding, message string) error {
		return apierrors.NewForbidden(leases, "", errors.New("ValidatingAdmissionPolicy 'buildlock-enforce' with binding '"+binding+"' denied request: "+message))
	}
	invalid := func(binding, message string) error {
		err := apierrors.NewInvalid(schema.GroupKind{Group: "coordination.k8s.io", Kind: "Lease"}, "", nil)
		err.ErrStatus.Message = "ValidatingAdmissionPolicy 'buildlock-enforce' with binding '" + binding + "' denied request: " + message
		return err
	}
	const ours = "buildlock-enforce.ci.staging"
	for name, tc := range map[string]struct {
		err    error
		result probeResult
		fence  grant.Fence
	}{
		"admitted": {result: probeAdmitted},
		"refused with the grant": {
			err:    refusal(ours, "buildlock-probe;token=3;holder=shop-41/uid-1;writer-pod=pod-1;accounts=pipeline;repositories=acme/shop,acme/web;writer-run=;writer-user="),
			result: probeRefused, fence: grant.Fence{Token: "3", Holder: "shop-41/uid-1", WriterPod: "pod-1", Accounts: "pipeline", Repositories: "acme/shop,acme/web"},
		},
		"a user name may hold any character, the separator too": {
			err:    refusal(ours, "buildlock-probe;token=1;holder=;writer-pod=;accounts=*;repositories=*;writer-run=5005/1;writer-user=https://idp#a;b=c"),
			result: probeRefused, fence: grant.Fence{Token: "1", Accounts: "*", Repositories: "*", WriterRun: "5005/1", WriterUser: "https://idp#a;b=c"},
		},
		"the grant Lease is missing": {
			err:    invalid(ours, "failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction"),
			result: probeParamMissing,
		},
		"refused by another lock's binding": {
			err:    refusal("buildlock-enforce.other.staging", "buildlock-probe;token=3;holder=;writer-pod=;accounts=*;repositories=*;writer-run=;writer-user="),
			result: probeFailed,
		},
		"refused by RBAC": {
			err:    apierrors.NewForbidden(leases, "", errors.New(`User "buildlock:enforcement-probe" cannot create resource "leases"`)),
			result: probeFailed,
		},
		"refused by the binding without the probe's fields": {
			err:    refusal(ours, "buildlock: namespace staging is held by BuildLock ci/shop-41"),
			result: probeFailed,
		},
		"a truncated refusal": {
			err:    refusal(ours, "buildlock-probe;token=3;holder=x"),
			result: probeFailed,
		},
		"not an API error": {err: errors.New("connection refused"), result: probeFailed},
	} {
		t.Run(name, func(t *testing.T) {
			result, fence := readProbe(lock, tc.err)
			if result != tc.result || fence != tc.fence {
				t.Errorf("readProbe = %v %+v, want %v %+v", result, fence, tc.result, tc.fence)
			}
		})
	}
}

func TestConsentCondition(t *testing.T) {
	lock := arbiter.Lock{Namespace: "ci", Target: "staging"}
	for name, tc := range map[string]struct {
		labels map[string]string
		exists bool
		reason string // "" : consents
	}{
		"no namespace":               {reason: buildlockv1.ReasonConsentMissing},
		"no label":                   {exists: true, reason: buildlockv1.ReasonConsentMissing},
		"another claims namespace's": {exists: true, labels: map[string]string{buildlockv1.LockedByLabel: "other"}, reason: buildlockv1.ReasonConflict},
		"this claims namespace's: the probe decides": {exists: true, labels: map[string]string{buildlockv1.LockedByLabel: "ci"}},
	} {
		t.Run(name, func(t *testing.T) {
			c := consentCondition(lock, tc.labels, tc.exists, 4)
			switch {
			case tc.reason == "" && c != nil:
				t.Errorf("condition %+v, want none", c)
			case tc.reason != "" && (c == nil || c.Reason != tc.reason || c.Status != metav1.ConditionFalse || c.ObservedGeneration != 4):
				t.Errorf("condition %+v, want False %s", c, tc.reason)
			}
		})
	}
}
