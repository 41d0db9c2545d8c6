package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

// Labels and annotations on the grant Leases, so that people and the cache
// can find them, and so that the grant record carries what the arbiter must
// remember.
const (
	managedByLabel = "app.kubernetes.io/managed-by"
	managedByValue = "buildlock"
	targetLabel    = "buildlock.io/target"
	// linesAnnotation records, per line, the highest build that held the
	// lock (JSON; see arbiter.Grant.Lines).
	linesAnnotation = "buildlock.io/lines"
	// endedAnnotation records how the previous hold ended (JSON; see
	// arbiter.Grant.Ended).
	endedAnnotation = "buildlock.io/ended"
	// buildlockPrefix starts every label and annotation key of buildlock's.
	buildlockPrefix = "buildlock.io/"
)

// tokenFloorLease names the Lease, one per namespace, that keeps the highest
// fencing token of the grant Leases deleted in that namespace. A target's
// name is a DNS label, so "buildlock-<target>" can never be this name, which
// has a dot.
const tokenFloorLease = "buildlock.token-floor"

// lineRecord is how a Grant.Lines entry is written in linesAnnotation
// (arbiter.LineRecord.Size bounds its length).
type lineRecord struct {
	Repo     string    `json:"repo"`
	Branch   string    `json:"branch"`
	Workflow string    `json:"workflow,omitempty"`
	Build    int64     `json:"build"`
	HeldAt   time.Time `json:"heldAt"`
	Owner    string    `json:"owner,omitempty"`
	Since    time.Time `json:"since,omitzero"`
}

// endingRecord is how Grant.Ended is written in endedAnnotation.
type endingRecord struct {
	Name   string    `json:"name"`
	UID    string    `json:"uid"`
	Phase  string    `json:"phase"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// writeGrant records grant in the lock's Lease as a compare-and-swap: an
// update carries the resourceVersion the decision was computed from, and a
// create fails if another writer created the Lease first. Either way a
// concurrent writer makes this call fail with a Conflict or AlreadyExists
// error, and the caller decides again. The Lease's renewTime says when it was
// last written (deleteIdleLease counts from it).
func writeGrant(ctx context.Context, c client.Client, mem *leaseMemory, lock arbiter.Lock, read *coordinationv1.Lease, grant arbiter.Grant, e *enforcement, now time.Time) (*coordinationv1.Lease, error) {
	lease, err := desiredLease(lock, read, grant, e)
	if err != nil {
		return nil, err
	}
	lease.Spec.RenewTime = &metav1.MicroTime{Time: now}
	if err := compareAndSwap(ctx, c, lease, read != nil); err != nil {
		return nil, fmt.Errorf("writing grant Lease %s/%s: %w", lease.Namespace, lease.Name, err)
	}
	mem.wrote(lease)
	return lease, nil
}

// desiredLease is the Lease read (nil: none yet) as it must be to carry
// grant and e: its labels, spec and annotations of buildlock's, everything
// else as it was.
func desiredLease(lock arbiter.Lock, read *coordinationv1.Lease, grant arbiter.Grant, e *enforcement) (*coordinationv1.Lease, error) {
	lease := &coordinationv1.Lease{}
	if read != nil {
		lease = read.DeepCopy()
	} else {
		lease.Namespace = lock.Namespace
		lease.Name = buildlockv1.GrantLeaseName(lock.Target)
	}
	if lease.Labels == nil {
		lease.Labels = map[string]string{}
	}
	lease.Labels[managedByLabel] = managedByValue
	lease.Labels[targetLabel] = lock.Target

	if grant.Token > math.MaxInt32 {
		return nil, fmt.Errorf("fencing token %d of target %q does not fit the Lease's leaseTransitions", grant.Token, lock.Target)
	}
	lease.Spec.LeaseTransitions = ptr.To(int32(grant.Token))
	lease.Spec.HolderIdentity = nil
	lease.Spec.AcquireTime = nil
	if grant.Holder != "" {
		lease.Spec.HolderIdentity = ptr.To(buildlockv1.GrantHolderIdentity(grant.Holder, types.UID(grant.HolderUID)))
		lease.Spec.AcquireTime = &metav1.MicroTime{Time: grant.AcquiredAt}
	}
	if err := setGrantAnnotations(lease, grant); err != nil {
		return nil, err
	}
	setEnforcement(lease, e)
	return lease, nil
}

// leaseCurrent reports whether the Lease read carries exactly grant and e
// (a lock without a Lease does while it records nothing and enforces
// nothing): when it does not, someone else wrote it, or a decision changed
// what it must carry, and it is written again.
func leaseCurrent(lock arbiter.Lock, read *coordinationv1.Lease, grant arbiter.Grant, e *enforcement) bool {
	if read == nil {
		return enforcementCurrent(nil, e) && grant.Holder == "" && len(grant.Lines) == 0
	}
	want, err := desiredLease(lock, read, grant, e)
	if err != nil {
		return true // writing it would fail the same way
	}
	return equality.Semantic.DeepEqual(want.Spec, read.Spec) && equality.Semantic.DeepEqual(want.Labels, read.Labels) &&
		equality.Semantic.DeepEqual(want.Annotations, read.Annotations)
}

// ownedLease reports whether lease, named like lock's grant Lease, is
// buildlock's: it carries buildlock's managed-by label, or any label or
// annotation of buildlock's (one whose labels a person removed is still
// buildlock's, and is repaired). A Lease with none of them was created by
// someone else, and is never taken over.
func ownedLease(lease *coordinationv1.Lease) bool {
	if lease.Labels[managedByLabel] == managedByValue {
		return true
	}
	for _, keys := range []map[string]string{lease.Labels, lease.Annotations} {
		for k := range keys {
			if strings.HasPrefix(k, buildlockPrefix) {
				return true
			}
		}
	}
	return false
}

// setGrantAnnotations writes the grant's line records, ending and audit
// into the Lease's annotations (removing them when empty).
func setGrantAnnotations(lease *coordinationv1.Lease, grant arbiter.Grant) error {
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	for _, key := range []string{linesAnnotation, endedAnnotation, buildlockv1.AuditAnnotation, writerPodAnnotation, writerUserAnnotation} {
		delete(lease.Annotations, key)
	}
	if grant.Writer.PodUID != "" {
		lease.Annotations[writerPodAnnotation] = grant.Writer.PodUID
	}
	if grant.Writer.Username != "" {
		lease.Annotations[writerUserAnnotation] = grant.Writer.Username
	}
	if len(grant.Lines) > 0 {
		records := make([]lineRecord, len(grant.Lines))
		for i, r := range grant.Lines {
			records[i] = lineRecord{Repo: r.Repo, Branch: r.Branch, Workflow: r.Workflow, Build: r.Build, HeldAt: r.HeldAt.UTC(),
				Owner: r.Owner, Since: r.Since.UTC()}
		}
		s, err := encodeUnescaped(records)
		if err != nil {
			return fmt.Errorf("encoding the line records of Lease %s: %w", lease.Name, err)
		}
		lease.Annotations[linesAnnotation] = s
	}
	if len(grant.Audit) > 0 {
		entries := make([]buildlockv1.AuditEntry, len(grant.Audit))
		for i, e := range grant.Audit {
			entries[i] = buildlockv1.AuditEntry{Kind: e.Kind, At: e.At.UTC(), Name: e.Name, Repo: e.Repo, Branch: e.Branch,
				Workflow: e.Workflow, Build: e.Build, Token: e.Token, By: e.By, Reason: e.Reason, From: e.From, Owner: e.Owner}
		}
		s, err := encodeUnescaped(entries)
		if err != nil {
			return fmt.Errorf("encoding the audit of Lease %s: %w", lease.Name, err)
		}
		lease.Annotations[buildlockv1.AuditAnnotation] = s
	}
	if e := grant.Ended; e.Name != "" {
		b, err := json.Marshal(endingRecord{Name: e.Name, UID: e.UID, Phase: string(e.Phase), Reason: e.Reason, At: e.At.UTC()})
		if err != nil {
			return fmt.Errorf("encoding the ending recorded in Lease %s: %w", lease.Name, err)
		}
		lease.Annotations[endedAnnotation] = string(b)
	}
	if len(lease.Annotations) == 0 {
		lease.Annotations = nil
	}
	return nil
}

// encodeUnescaped is v as JSON without HTML escaping, as
// arbiter.LineRecord.Size and arbiter.AuditEntry.Size count.
func encodeUnescaped(v any) (string, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", err
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}

// grantFromLease reads the grant record; a nil Lease is a lock without one
// (never granted, cleaned up, or deleted by someone), whose record the
// arbiter restores from the claims (Absent). Records that do not decode
// (the Lease was edited by hand) are left out, and so restored from the
// claims too.
func grantFromLease(lease *coordinationv1.Lease) arbiter.Grant {
	var g arbiter.Grant
	if lease == nil {
		g.Absent = true
		return g
	}
	if lease.Spec.HolderIdentity != nil {
		name, uid := buildlockv1.ParseGrantHolder(*lease.Spec.HolderIdentity)
		g.Holder, g.HolderUID = name, string(uid)
	}
	if lease.Spec.LeaseTransitions != nil {
		g.Token = int64(*lease.Spec.LeaseTransitions)
	}
	if lease.Spec.AcquireTime != nil {
		g.AcquiredAt = lease.Spec.AcquireTime.Time
	}
	g.Writer = arbiter.Writer{PodUID: lease.Annotations[writerPodAnnotation], Username: lease.Annotations[writerUserAnnotation]}
	var records []lineRecord
	if s := lease.Annotations[linesAnnotation]; s != "" && json.Unmarshal([]byte(s), &records) == nil {
		for _, r := range records {
			g.Lines = append(g.Lines, arbiter.LineRecord{Repo: r.Repo, Branch: r.Branch, Workflow: r.Workflow, Build: r.Build,
				HeldAt: r.HeldAt, Owner: r.Owner, Since: r.Since})
		}
	}
	var entries []buildlockv1.AuditEntry
	if s := lease.Annotations[buildlockv1.AuditAnnotation]; s != "" && json.Unmarshal([]byte(s), &entries) == nil {
		for _, e := range entries {
			g.Audit = append(g.Audit, arbiter.AuditEntry{Kind: e.Kind, At: e.At, Name: e.Name, Repo: e.Repo, Branch: e.Branch,
				Workflow: e.Workflow, Build: e.Build, Token: e.Token, By: e.By, Reason: e.Reason, From: e.From, Owner: e.Owner})
		}
	}
	var e endingRecord
	if s := lease.Annotations[endedAnnotation]; s != "" && json.Unmarshal([]byte(s), &e) == nil {
		g.Ended = arbiter.Ending{Name: e.Name, UID: e.UID, Phase: arbiter.Phase(e.Phase), Reason: e.Reason, At: e.At}
	}
	return g
}

// lastWritten is when the Lease was last written: its renewTime, else (a
// Lease written by an older operator) its acquireTime or creation.
func lastWritten(lease *coordinationv1.Lease) time.Time {
	switch {
	case lease.Spec.RenewTime != nil:
		return lease.Spec.RenewTime.Time
	case lease.Spec.AcquireTime != nil:
		return lease.Spec.AcquireTime.Time
	}
	return lease.CreationTimestamp.Time
}

// readTokenFloor reads, live, the highest token of the namespace's deleted
// grant Leases (0 if none was ever deleted).
func readTokenFloor(ctx context.Context, reader client.Reader, namespace string) (int64, *coordinationv1.Lease, error) {
	var lease coordinationv1.Lease
	err := reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: tokenFloorLease}, &lease)
	switch {
	case apierrors.IsNotFound(err):
		return 0, nil, nil
	case err != nil:
		return 0, nil, fmt.Errorf("reading the token floor of namespace %q: %w", namespace, err)
	case lease.Spec.LeaseTransitions == nil:
		return 0, &lease, nil
	}
	return int64(*lease.Spec.LeaseTransitions), &lease, nil
}

// raiseTokenFloor makes the namespace's token floor at least token, as a
// compare-and-swap on what readTokenFloor returned.
func raiseTokenFloor(ctx context.Context, c client.Client, mem *leaseMemory, namespace string, read *coordinationv1.Lease, floor, token int64) error {
	if token <= floor && read != nil {
		return nil
	}
	if token > math.MaxInt32 {
		return fmt.Errorf("token floor %d of namespace %q does not fit a Lease", token, namespace)
	}
	lease := &coordinationv1.Lease{}
	if read != nil {
		lease = read.DeepCopy()
	} else {
		lease.Namespace, lease.Name = namespace, tokenFloorLease
		lease.Labels = map[string]string{managedByLabel: managedByValue}
	}
	lease.Spec.LeaseTransitions = ptr.To(int32(max(floor, token)))
	if lease.Labels[managedByLabel] != managedByValue {
		// So that the cache, and the watch that restores a deleted floor,
		// see it.
		if lease.Labels == nil {
			lease.Labels = map[string]string{}
		}
		lease.Labels[managedByLabel] = managedByValue
	}
	if err := compareAndSwap(ctx, c, lease, read != nil); err != nil {
		return fmt.Errorf("raising the token floor of namespace %q to %d: %w", namespace, token, err)
	}
	mem.wrote(lease)
	return nil
}

// compareAndSwap writes a Lease that was read (an update carrying the
// resourceVersion read, which fails with a Conflict if another writer came
// first) or that was not there (a create, which fails with AlreadyExists).
func compareAndSwap(ctx context.Context, c client.Client, lease *coordinationv1.Lease, read bool) error {
	if read {
		return c.Update(ctx, lease)
	}
	return c.Create(ctx, lease)
}

// deleteIdleLease deletes the grant Lease of a lock that has no claims and
// has not been written for retention, first raising the namespace's token
// floor to its token so that a later Lease of the target never issues a token
// again: a new Lease is only created after a read found none, which follows
// the delete, which follows the floor's raise. The delete is conditional on
// the Lease being unchanged. It returns when to look again (zero: deleted,
// or nothing to do).
func deleteIdleLease(ctx context.Context, c client.Client, reader client.Reader, mem *leaseMemory, lease *coordinationv1.Lease, retention time.Duration, now time.Time) (time.Time, error) {
	if lease == nil || lease.Spec.HolderIdentity != nil {
		return time.Time{}, nil
	}
	if due := lastWritten(lease).Add(retention); now.Before(due) {
		return due, nil
	}
	floor, read, err := readTokenFloor(ctx, reader, lease.Namespace)
	if err != nil {
		return time.Time{}, err
	}
	var token int64
	if lease.Spec.LeaseTransitions != nil {
		token = int64(*lease.Spec.LeaseTransitions)
	}
	if err := raiseTokenFloor(ctx, c, mem, lease.Namespace, read, floor, token); err != nil {
		return time.Time{}, err
	}
	err = c.Delete(ctx, lease, client.Preconditions{UID: &lease.UID, ResourceVersion: &lease.ResourceVersion})
	if err != nil && !apierrors.IsNotFound(err) {
		return time.Time{}, fmt.Errorf("deleting idle grant Lease %s/%s: %w", lease.Namespace, lease.Name, err)
	}
	return time.Time{}, nil
}
