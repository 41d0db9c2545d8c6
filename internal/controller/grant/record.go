// Package grant reads and writes a lock's grant record: the grant Lease
// (api/v1alpha1 GrantLeaseName), which the lock reconciler writes as a
// compare-and-swap on every grant, with what enforcement needs in the same
// write; the namespace's token floor, which holds every fencing token issued
// there (Reserve); and what a manager remembers of both
// while it runs (Memory). The lock reconciler, the policy controller and the
// garbage collections share it; it knows none of them.
package grant

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

// Labels on the Leases and bindings buildlock writes, so that people and the
// manager's cache (which holds buildlock's alone) can find them.
const (
	// ManagedByLabel, with ManagedByValue, marks every Lease and binding
	// of buildlock's.
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "buildlock"
	// TargetLabel names the target of a grant Lease or binding.
	TargetLabel = "buildlock.io/target"
)

// TokenFloorLease names the Lease, one per namespace, whose token is at
// least every fencing token issued in that namespace (raised ahead of the
// grants, Reserve, and to a Lease's token before the Lease is deleted): a
// Lease created later issues tokens above it, so that a token never
// repeats. A
// target's name is a DNS label, so "buildlock-<target>" can never be this
// name, which has a dot.
const TokenFloorLease = "buildlock.token-floor"

// Annotations of the grant record: what the arbiter must remember.
const (
	// linesAnnotation records, per line, the highest build that held the
	// lock (JSON; see arbiter.Grant.Lines).
	linesAnnotation = "buildlock.io/lines"
	// endedAnnotation records how the previous hold ended (JSON; see
	// arbiter.Grant.Ended).
	endedAnnotation = "buildlock.io/ended"
	// buildlockPrefix starts every label and annotation key of buildlock's.
	buildlockPrefix = "buildlock.io/"
)

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
	// OwnerCI: the owner is a CI identity (arbiter.LineRecord.OwnerCI).
	OwnerCI bool `json:"ownerCI,omitempty"`
	// Token: the grant's fencing token (arbiter.LineRecord.Token).
	Token int64 `json:"token,omitempty"`
	// Started: when the granted build started (arbiter.LineRecord.Started).
	Started time.Time `json:"started,omitzero"`
}

// endingRecord is how Grant.Ended is written in endedAnnotation.
type endingRecord struct {
	Name   string    `json:"name"`
	UID    string    `json:"uid"`
	Phase  string    `json:"phase"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// desiredLease is the Lease read (nil: none yet) as it must be to carry
// grant and e: its labels, spec and annotations of buildlock's, everything
// else as it was.
func desiredLease(lock arbiter.Lock, read *coordinationv1.Lease, grant arbiter.Grant, e *Enforcement) (*coordinationv1.Lease, error) {
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
	lease.Labels[ManagedByLabel] = ManagedByValue
	lease.Labels[TargetLabel] = lock.Target

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

// Current reports whether the Lease read carries exactly grant and e (a
// lock without a Lease does while it records nothing and enforces nothing):
// when it does not, someone else wrote it, or a decision changed what it
// must carry, and it is written again.
func Current(lock arbiter.Lock, read *coordinationv1.Lease, grant arbiter.Grant, e *Enforcement) bool {
	if read == nil {
		return EnforcementCurrent(nil, e) && grant.Holder == "" && len(grant.Lines) == 0
	}
	want, err := desiredLease(lock, read, grant, e)
	if err != nil {
		return true // writing it would fail the same way
	}
	return equality.Semantic.DeepEqual(want.Spec, read.Spec) && equality.Semantic.DeepEqual(want.Labels, read.Labels) &&
		equality.Semantic.DeepEqual(want.Annotations, read.Annotations)
}

// Owned reports whether lease, named like a lock's grant Lease, is
// buildlock's: it carries buildlock's managed-by label, or any label or
// annotation of buildlock's (one whose labels a person removed is still
// buildlock's, and is repaired). A Lease with none of them was created by
// someone else, and is never taken over.
func Owned(lease *coordinationv1.Lease) bool {
	if lease.Labels[ManagedByLabel] == ManagedByValue {
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

// ForeignLeaseProblem says that lease, named like a lock's grant Lease,
// is somebody else's (not Owned): how the claims' ForeignLease reason and
// the policy's Enforced condition name it.
func ForeignLeaseProblem(lease *coordinationv1.Lease) string {
	return fmt.Sprintf("Lease %s/%s exists but was not created by buildlock (it has no label %s=%s)",
		lease.Namespace, lease.Name, ManagedByLabel, ManagedByValue)
}

// setGrantAnnotations writes the grant's line records, ending, audit and writer
// into the Lease's annotations (removing them when empty).
func setGrantAnnotations(lease *coordinationv1.Lease, grant arbiter.Grant) error {
	if lease.Annotations == nil {
		lease.Annotations = map[string]string{}
	}
	for _, key := range []string{linesAnnotation, endedAnnotation, buildlockv1.AuditAnnotation, writerPodAnnotation, writerUserAnnotation, writerRunAnnotation} {
		delete(lease.Annotations, key)
	}
	if grant.Writer.PodUID != "" {
		lease.Annotations[writerPodAnnotation] = grant.Writer.PodUID
	}
	if grant.Writer.Username != "" {
		lease.Annotations[writerUserAnnotation] = grant.Writer.Username
	}
	if grant.Writer.Run != "" {
		lease.Annotations[writerRunAnnotation] = grant.Writer.Run
	}
	if len(grant.Lines) > 0 {
		records := make([]lineRecord, len(grant.Lines))
		for i, r := range grant.Lines {
			records[i] = lineRecord{Repo: r.Repo, Branch: r.Branch, Workflow: r.Workflow, Build: r.Build, HeldAt: r.HeldAt.UTC(),
				Owner: r.Owner, OwnerCI: r.OwnerCI, Since: r.Since.UTC(), Token: r.Token, Started: r.Started.UTC()}
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

// FromLease reads the grant record; a nil Lease is a lock without one
// (never granted, cleaned up, or deleted by someone), whose record the
// arbiter restores from the claims (Absent). Records that do not decode
// (the Lease was edited by hand) are left out, and so restored from the
// claims too.
func FromLease(lease *coordinationv1.Lease) arbiter.Grant {
	var g arbiter.Grant
	if lease == nil {
		g.Absent = true
		return g
	}
	if lease.Spec.HolderIdentity != nil {
		name, uid := buildlockv1.ParseGrantHolder(*lease.Spec.HolderIdentity)
		g.Holder, g.HolderUID = name, string(uid)
	}
	g.Token = buildlockv1.GrantToken(lease)
	if lease.Spec.AcquireTime != nil {
		g.AcquiredAt = lease.Spec.AcquireTime.Time
	}
	g.Writer = arbiter.Writer{
		PodUID: lease.Annotations[writerPodAnnotation], Username: lease.Annotations[writerUserAnnotation], Run: lease.Annotations[writerRunAnnotation],
	}
	var records []lineRecord
	if s := lease.Annotations[linesAnnotation]; s != "" && json.Unmarshal([]byte(s), &records) == nil {
		for _, r := range records {
			g.Lines = append(g.Lines, arbiter.LineRecord{Repo: r.Repo, Branch: r.Branch, Workflow: r.Workflow, Build: r.Build,
				HeldAt: r.HeldAt, Owner: r.Owner, OwnerCI: r.OwnerCI, Since: r.Since, Token: r.Token, Started: r.Started})
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

// LastWritten is when the Lease was last written: its renewTime, else (a
// Lease written by an older operator) its acquireTime or creation.
func LastWritten(lease *coordinationv1.Lease) time.Time {
	switch {
	case lease.Spec.RenewTime != nil:
		return lease.Spec.RenewTime.Time
	case lease.Spec.AcquireTime != nil:
		return lease.Spec.AcquireTime.Time
	}
	return lease.CreationTimestamp.Time
}

// Get reads the lock's grant Lease through reader (the cache, or the API
// server); nil when it does not exist.
func Get(ctx context.Context, reader client.Reader, lock arbiter.Lock) (*coordinationv1.Lease, error) {
	var lease coordinationv1.Lease
	err := reader.Get(ctx, types.NamespacedName{Namespace: lock.Namespace, Name: buildlockv1.GrantLeaseName(lock.Target)}, &lease)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading grant Lease for target %q in %q: %w", lock.Target, lock.Namespace, err)
	}
	return &lease, nil
}

// TargetOf is the target whose grant Lease this is, by its name
// (buildlock-<target>): the name is what every reader goes by, whatever its
// labels say.
func TargetOf(lease client.Object) (string, bool) {
	target, ok := strings.CutPrefix(lease.GetName(), buildlockv1.GrantLeaseName(""))
	return target, ok && target != ""
}

// ReadTokenFloor reads the namespace's token floor through reader, which
// must be live, or the cache that showed a version of a grant Lease of the
// namespace: no compare-and-swap would catch a stale floor, and a token
// must never repeat. (The cache's floor comes from the same watch as that
// version, in etcd's order: it holds every token reserved before the
// version was written, which is every token the Lease carried before it.)
// It returns the floor (0 if no Lease was ever deleted there) and the
// floor Lease (nil when there is none).
func ReadTokenFloor(ctx context.Context, reader client.Reader, namespace string) (int64, *coordinationv1.Lease, error) {
	var lease coordinationv1.Lease
	err := reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: TokenFloorLease}, &lease)
	switch {
	case apierrors.IsNotFound(err):
		return 0, nil, nil
	case err != nil:
		return 0, nil, fmt.Errorf("reading the token floor of namespace %q: %w", namespace, err)
	}
	return buildlockv1.GrantToken(&lease), &lease, nil
}
