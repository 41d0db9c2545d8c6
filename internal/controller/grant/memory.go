package grant

import (
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/internal/arbiter"
)

// Memory is what a manager remembers of the grant Leases while it runs: the
// highest fencing token it has seen for each lock and each namespace's
// token floor, so that a Lease a person deletes or edits never makes a
// token repeat (they are the arbiter's Grant.Floor, and what a deleted floor
// Lease is restored to); and the resourceVersions of its own latest writes
// of each Lease, so that the Lease watches pass on everybody else's writes
// and not its own. It only grows from what the API server returned (Lease
// events, claims, its own writes), so it is never stale in the harmful
// direction: a token above it is only ever skipped, never repeated.
//
// It also keeps the grant Lease as this manager's latest write of it left
// it, for the moment until the cache shows that write (Fresher): a decision
// taken on the cache then starts from the Lease as it is, not from the
// version before, which a compare-and-swap would refuse.
//
// It keeps, too, for each lock whose grant Lease it found written by
// somebody else (a person's edit, another manager's write, or any version
// it saw before it wrote one itself: after a start), the namespace's token
// floor as it was then (LockFloor): that floor holds every token issued
// for the lock before that write, whatever the write did to the Lease's
// token, so the lock's next token goes above it. And it knows which locks'
// grant Lease names are taken by a Lease of somebody else's (Foreign).
//
// A nil Memory remembers nothing. Entries go with what they describe: a
// lock's token and floor once the lock has no Lease and no claim and the
// namespace's floor holds its token (ForgetUpTo), a write once its Lease is
// deleted. So the memory does not grow with throw-away targets.
type Memory struct {
	mu     sync.Mutex
	tokens map[arbiter.Lock]int64
	floors map[string]int64
	// lockFloors holds, per lock, the namespace's floor when a version of
	// its grant Lease that this manager did not write was found
	// (NoteLockFloor).
	lockFloors map[arbiter.Lock]lockFloor
	// foreign holds the locks whose grant Lease name a Lease of somebody
	// else's takes, as last found.
	foreign map[arbiter.Lock]*coordinationv1.Lease
	// written holds the resourceVersions of this manager's latest writes
	// of each Lease (a few: the watch may deliver one after the next write).
	written map[types.NamespacedName][]string
	// latest holds this manager's latest write of each grant Lease, until
	// the cache shows it or something newer (Fresher).
	latest map[types.NamespacedName]ownWrite
}

// lockFloor is the namespace's token floor found for a lock's grant Lease
// at version (a resourceVersion; "" for a lock without a Lease).
type lockFloor struct {
	floor   int64
	version string
}

// ownWrite is a grant Lease as this manager's write returned it, and when.
type ownWrite struct {
	lease *coordinationv1.Lease
	at    time.Time
}

// OwnWriteKept is how long a manager prefers its own latest write of an
// object (a grant Lease, a claim's status) to an older version in its
// cache. The cache shows the write within moments; this bounds what a
// write the cache never shows (the object deleted before the watch
// delivered it, then a re-list) can make a decision assume: a
// compare-and-swap on it fails, and the lock is decided again on live
// reads.
const OwnWriteKept = 5 * time.Second

// OwnWriteStands reports whether this manager's write at writtenAt, which
// left the object at resourceVersion own, is still the version to decide
// with at now rather than the cache's, cached ("": the cache has none):
// kept for less than OwnWriteKept, and later than the cache's.
// resourceVersions that do not compare as the API server's integers leave
// the cache's word standing.
func OwnWriteStands(own, cached string, writtenAt, now time.Time) bool {
	if now.Sub(writtenAt) > OwnWriteKept {
		return false
	}
	if cached == "" {
		return true
	}
	newer, err := resourceversion.CompareResourceVersion(own, cached)
	return err == nil && newer > 0
}

// ownWritesKept is how many of its latest writes of one Lease a manager
// recognizes as its own.
const ownWritesKept = 4

// NewMemory returns an empty memory.
func NewMemory() *Memory {
	return &Memory{tokens: map[arbiter.Lock]int64{}, floors: map[string]int64{}, written: map[types.NamespacedName][]string{},
		latest: map[types.NamespacedName]ownWrite{}, lockFloors: map[arbiter.Lock]lockFloor{}, foreign: map[arbiter.Lock]*coordinationv1.Lease{}}
}

// Observe remembers the token of a grant Lease or of a token floor Lease
// (whatever its state, even a deleted one's last).
func (m *Memory) Observe(lease *coordinationv1.Lease) {
	token := buildlockv1.GrantToken(lease)
	if m == nil || token <= 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if lease.Name == TokenFloorLease {
		m.floors[lease.Namespace] = max(m.floors[lease.Namespace], token)
		return
	}
	if target, ok := TargetOf(lease); ok {
		lock := arbiter.Lock{Namespace: lease.Namespace, Target: target}
		m.tokens[lock] = max(m.tokens[lock], token)
	}
}

// ObserveToken remembers that token was seen for lock.
func (m *Memory) ObserveToken(lock arbiter.Lock, token int64) {
	if m == nil || token <= 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tokens[lock] = max(m.tokens[lock], token)
}

// Highest is the highest token seen for lock (0 if none).
func (m *Memory) Highest(lock arbiter.Lock) int64 {
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.tokens[lock]
}

// Floor is the highest token floor seen in namespace (0 if none).
func (m *Memory) Floor(namespace string) int64 {
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.floors[namespace]
}

// ForgetUpTo drops what is remembered of lock if it is no higher than
// floor, a token the namespace's floor holds: the floor keeps it from then
// on. A token seen meanwhile (a Lease created again) is kept.
func (m *Memory) ForgetUpTo(lock arbiter.Lock, floor int64) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tokens[lock] <= floor {
		delete(m.tokens, lock)
		delete(m.lockFloors, lock)
	}
}

// LockFloorKnown reports whether the namespace's floor was noted for the
// version of lock's grant Lease (NoteLockFloor): then it need not be read
// again for that version.
func (m *Memory) LockFloorKnown(lock arbiter.Lock, version string) bool {
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	f, ok := m.lockFloors[lock]
	return ok && f.version == version
}

// NoteLockFloor records floor, the namespace's token floor read for
// version of lock's grant Lease, a version this manager did not write: the
// lock's tokens so far are at most floor. It keeps the highest floor noted.
func (m *Memory) NoteLockFloor(lock arbiter.Lock, version string, floor int64) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lockFloors[lock] = lockFloor{floor: max(m.lockFloors[lock].floor, floor), version: version}
}

// LockFloor is the highest namespace's floor noted for lock (0 if none):
// every token the lock issued before a version of its Lease that this
// manager did not write is at most it (the arbiter's Grant.Reserved).
func (m *Memory) LockFloor(lock arbiter.Lock) int64 {
	if m == nil {
		return 0
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lockFloors[lock].floor
}

// NoteForeign records that lease, a Lease of somebody else's, takes the
// name of lock's grant Lease; nil: a live read found none there.
func (m *Memory) NoteForeign(lock arbiter.Lock, lease *coordinationv1.Lease) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if lease == nil {
		delete(m.foreign, lock)
		return
	}
	m.foreign[lock] = lease.DeepCopy()
}

// Foreign is the Lease of somebody else's last found under lock's grant
// Lease name (NoteForeign), or nil. The cache holds buildlock's Leases
// alone, so nothing says when it goes: its lock reads it live again
// instead of writing a Lease that cannot be created.
func (m *Memory) Foreign(lock arbiter.Lock) *coordinationv1.Lease {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if f := m.foreign[lock]; f != nil {
		return f.DeepCopy()
	}
	return nil
}

// Wrote records this manager's write of lease (its resourceVersion after
// the write), and remembers its token.
func (m *Memory) Wrote(lease *coordinationv1.Lease) {
	if m == nil {
		return
	}
	m.Observe(lease)
	m.mu.Lock()
	defer m.mu.Unlock()
	key := client.ObjectKeyFromObject(lease)
	recent := append(m.written[key], lease.ResourceVersion)
	m.written[key] = recent[max(0, len(recent)-ownWritesKept):]
}

// Granted records this manager's write at now of grant Lease lease, which
// Fresher returns until the cache shows it.
func (m *Memory) Granted(lease *coordinationv1.Lease, now time.Time) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.latest[client.ObjectKeyFromObject(lease)] = ownWrite{lease: lease.DeepCopy(), at: now}
}

// Fresher returns the grant Lease named key to decide with at now: cached,
// the cache's version (nil: the cache has none), unless this manager wrote
// it since (Granted) and the cache does not show that write yet; then that
// write. A write is forgotten once the cache shows it or a later version,
// once the Lease is seen deleted, and OwnWriteKept after it was made
// (OwnWriteStands).
func (m *Memory) Fresher(key types.NamespacedName, cached *coordinationv1.Lease, now time.Time) *coordinationv1.Lease {
	if m == nil {
		return cached
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	own, ok := m.latest[key]
	if !ok {
		return cached
	}
	cachedVersion := ""
	if cached != nil {
		cachedVersion = cached.ResourceVersion
	}
	if !OwnWriteStands(own.lease.ResourceVersion, cachedVersion, own.at, now) {
		delete(m.latest, key)
		return cached
	}
	return own.lease.DeepCopy()
}

// Own reports whether lease is as this manager last wrote it.
func (m *Memory) Own(lease client.Object) bool {
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Contains(m.written[client.ObjectKeyFromObject(lease)], lease.GetResourceVersion())
}

// Deleted forgets this manager's writes of a Lease that is gone.
func (m *Memory) Deleted(lease client.Object) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.written, client.ObjectKeyFromObject(lease))
	delete(m.latest, client.ObjectKeyFromObject(lease))
}
