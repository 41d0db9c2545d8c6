package chaos

import (
	"fmt"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// Ledger is what the workload did, written down before each call so that the
// checker can tell the workload's changes from anybody else's. A write that
// then fails leaves its intent in the ledger: the checker only ever allows
// more for it, never less.
type Ledger struct {
	now     func() time.Time
	mu      sync.Mutex
	specs   map[string]map[string]time.Time      // ns/name → canonical specs written, and when first
	first   map[string]buildlockv1.BuildLockSpec // ns/name → the first spec written (its creation)
	deletes map[string]bool                      // ns/name of claims the workload deleted
	forced  map[string]bool                      // ns/name of claims a person force-released
	pods    map[string]*PodRecord                // ns/name of pods the workload created

	// What people did to the grant records and to namespaces' consent,
	// and what pipelines tried (people.go).
	leaseEdits    map[string]map[string]bool // ns/name → LeaseKey of each version a person wrote
	leaseDeletes  map[types.UID]bool         // Leases a person deleted
	touched       map[string]bool            // ns/name of Leases a person deleted or wrote
	foreignLeases map[string]bool            // ns/name of Leases a person created that are not buildlock's
	consent       map[string]map[string]bool // namespace → values of its consent label people set ("" removes it)
	triedConsent  map[string]map[string]bool // namespace → values pipelines tried to set
	overrides     map[string]bool            // ns/name of claims a person overrode (windows.go)
}

// PodRecord is what the workload did to one pod.
type PodRecord struct {
	UID types.UID
	// Finished: the workload set the pod's phase to Succeeded or Failed.
	Finished bool
	// Deleted: the workload deleted the pod.
	Deleted bool
}

// NewLedger returns an empty ledger that stamps writes with now (the
// workload's clock).
func NewLedger(now func() time.Time) *Ledger {
	return &Ledger{now: now, specs: map[string]map[string]time.Time{}, first: map[string]buildlockv1.BuildLockSpec{}, deletes: map[string]bool{}, forced: map[string]bool{}, pods: map[string]*PodRecord{},
		leaseEdits: map[string]map[string]bool{}, leaseDeletes: map[types.UID]bool{}, touched: map[string]bool{}, foreignLeases: map[string]bool{},
		consent: map[string]map[string]bool{}, triedConsent: map[string]map[string]bool{}}
}

// WroteSpec records that the workload creates or updates claim ns/name with
// spec, now.
func (l *Ledger) WroteSpec(ns, name string, spec buildlockv1.BuildLockSpec) {
	l.mu.Lock()
	defer l.mu.Unlock()
	key := ns + "/" + name
	if l.specs[key] == nil {
		l.specs[key] = map[string]time.Time{}
		l.first[key] = *spec.DeepCopy()
	}
	if _, ok := l.specs[key][SpecKey(spec)]; !ok {
		l.specs[key][SpecKey(spec)] = l.now()
	}
}

// SpecWritten reports whether the workload ever wrote spec for ns/name, and
// when it first sent it.
func (l *Ledger) SpecWritten(ns, name string, spec buildlockv1.BuildLockSpec) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	at, ok := l.specs[ns+"/"+name][SpecKey(spec)]
	return at, ok
}

// FirstSpec returns the spec the workload created ns/name with.
func (l *Ledger) FirstSpec(ns, name string) (buildlockv1.BuildLockSpec, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	spec, ok := l.first[ns+"/"+name]
	return spec, ok
}

// RequestDelete records that the workload (the claim's owner) deletes ns/name.
func (l *Ledger) RequestDelete(ns, name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deletes[ns+"/"+name] = true
}

// DeleteRequested reports whether the workload deleted ns/name.
func (l *Ledger) DeleteRequested(ns, name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deletes[ns+"/"+name]
}

// RequestForceRelease records that a person force-releases ns/name (sets
// its force-release annotation).
func (l *Ledger) RequestForceRelease(ns, name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.forced[ns+"/"+name] = true
}

// ForceReleaseRequested reports whether somebody force-released ns/name.
func (l *Ledger) ForceReleaseRequested(ns, name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.forced[ns+"/"+name]
}

// PodCreated records a pod the workload created.
func (l *Ledger) PodCreated(ns, name string, uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pods[ns+"/"+name] = &PodRecord{UID: uid}
}

// PodFinishing records that the workload sets the pod's phase to Succeeded or
// Failed; finished=false takes it back when the write failed.
func (l *Ledger) PodFinishing(ns, name string, finished bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.pods[ns+"/"+name]; p != nil {
		p.Finished = finished
	}
}

// PodDeleting records that the workload deletes the pod.
func (l *Ledger) PodDeleting(ns, name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.pods[ns+"/"+name]; p != nil {
		p.Deleted = true
	}
}

// PodGone reports whether the pod a claim references is gone as far as the
// workload knows: never created, deleted, or another UID than the reference.
func (l *Ledger) PodGone(ns string, ref *buildlockv1.PodReference) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.pods[ns+"/"+ref.Name]
	return p == nil || p.Deleted || (ref.UID != "" && types.UID(ref.UID) != p.UID)
}

// PodFinished reports whether the workload finished the referenced pod.
func (l *Ledger) PodFinished(ns string, ref *buildlockv1.PodReference) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.pods[ns+"/"+ref.Name]
	return p != nil && p.Finished && (ref.UID == "" || types.UID(ref.UID) == p.UID)
}

// SpecKey renders a spec canonically, with the API's defaults applied and
// times at the API's microsecond precision, so that what the workload wrote
// (in whatever RFC 3339 form) and what the API server returns compare equal.
func SpecKey(s buildlockv1.BuildLockSpec) string {
	var b strings.Builder
	fmt.Fprintf(&b, "target=%s repo=%s branch=%q build=%d", s.Target, s.Repo, s.Branch, s.Build)
	if s.PodRef != nil {
		fmt.Fprintf(&b, " pod=%s/%s", s.PodRef.Name, s.PodRef.UID)
	}
	if s.Timestamp != nil {
		fmt.Fprintf(&b, " timestamp=%d", s.Timestamp.UnixMicro())
	}
	if s.ExpiresAfter != nil {
		fmt.Fprintf(&b, " expiresAfter=%s", s.ExpiresAfter.Duration)
	}
	if s.RenewTime != nil {
		fmt.Fprintf(&b, " renewTime=%d", s.RenewTime.UnixMicro())
	}
	return b.String()
}

// PersonWritesLease records that a person writes Lease l as it is (an
// update of the version read, so its renewTime is the one the operator
// wrote last): the version it makes is not the operator's.
func (l *Ledger) PersonWritesLease(lease *coordinationv1.Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	key := lease.Namespace + "/" + lease.Name
	if l.leaseEdits[key] == nil {
		l.leaseEdits[key] = map[string]bool{}
	}
	l.leaseEdits[key][LeaseKey(lease)] = true
	l.touched[key] = true
}

// PersonWroteLease reports whether this version of a Lease is one a person
// wrote.
func (l *Ledger) PersonWroteLease(lease *coordinationv1.Lease) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leaseEdits[lease.Namespace+"/"+lease.Name][LeaseKey(lease)]
}

// PersonDeletesLease records that a person deletes Lease lease (that
// very object: its UID).
func (l *Ledger) PersonDeletesLease(lease *coordinationv1.Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leaseDeletes[lease.UID] = true
	l.touched[lease.Namespace+"/"+lease.Name] = true
}

// PersonTouchedLease reports whether a person deleted or wrote Lease
// ns/name.
func (l *Ledger) PersonTouchedLease(ns, name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.touched[ns+"/"+name]
}

// PersonDeletedLease reports whether a person deleted the Lease uid.
func (l *Ledger) PersonDeletedLease(uid types.UID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leaseDeletes[uid]
}

// PersonCreatesForeignLease records that a person creates Lease ns/name
// for a purpose of their own: it carries none of buildlock's labels or
// annotations, and the operator must never take it over.
func (l *Ledger) PersonCreatesForeignLease(ns, name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.foreignLeases[ns+"/"+name] = true
}

// ForeignLeaseCreated reports whether a person created Lease ns/name as
// not buildlock's.
func (l *Ledger) ForeignLeaseCreated(ns, name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.foreignLeases[ns+"/"+name]
}

// PersonSetsConsent records that a person sets namespace ns's consent label
// (buildlockv1.LockedByLabel) to value, or removes it ("").
func (l *Ledger) PersonSetsConsent(ns, value string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.consent[ns] == nil {
		l.consent[ns] = map[string]bool{}
	}
	l.consent[ns][value] = true
}

// ConsentSet reports whether a person set namespace ns's consent label to
// value ("": removed it).
func (l *Ledger) ConsentSet(ns, value string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.consent[ns][value]
}

// PipelineTriesConsent records that a pipeline tries to set namespace ns's
// consent label to value ("": remove it), which admission must refuse.
func (l *Ledger) PipelineTriesConsent(ns, value string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.triedConsent[ns] == nil {
		l.triedConsent[ns] = map[string]bool{}
	}
	l.triedConsent[ns][value] = true
}

// PipelineTriedConsent reports whether a pipeline tried to set namespace
// ns's consent label to value.
func (l *Ledger) PipelineTriedConsent(ns, value string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.triedConsent[ns][value]
}

// LeaseKey renders what tells one version of a grant Lease from another as
// its writers see it: the holder, the token, the times and the writer
// annotations. The operator stamps renewTime with its clock on every write,
// so a person's update of a version it read (which keeps that renewTime)
// never has the key of a version the operator wrote.
func LeaseKey(l *coordinationv1.Lease) string {
	s := l.Spec
	var b strings.Builder
	if s.HolderIdentity != nil {
		fmt.Fprintf(&b, "holder=%s", *s.HolderIdentity)
	}
	if s.LeaseTransitions != nil {
		fmt.Fprintf(&b, " token=%d", *s.LeaseTransitions)
	}
	if s.AcquireTime != nil {
		fmt.Fprintf(&b, " acquired=%d", s.AcquireTime.UnixMicro())
	}
	if s.RenewTime != nil {
		fmt.Fprintf(&b, " renewed=%d", s.RenewTime.UnixMicro())
	}
	fmt.Fprintf(&b, " writer=%s/%s", l.Annotations[WriterPodAnnotation], l.Annotations[WriterUserAnnotation])
	return b.String()
}
