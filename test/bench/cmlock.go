//go:build bench

package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// This file is the client-side protocol that buildlock replaces, written
// compactly for the benchmark: there is no operator. Contenders for a target
// negotiate through one ConfigMap:
//   - whoever creates it holds the lock, and releases by deleting it;
//   - its owner reference (or, without a pod, an expiry annotation) names the
//     holder; its data names the one build waiting next, which a newer
//     contender overwrites and an older one gives up against;
//   - waiters watch the ConfigMap and the holder's pod, and race to create
//     the ConfigMap again once it is gone or the holder has ended;
//   - a request that fails is retried after a pause, as a pipeline's script
//     would; a create whose answer was lost may have made the contender the
//     holder, which its holder annotation (set at creation, never changed)
//     tells on the next read.

// cmState is where a contender stands.
type cmState int

const (
	cmWaiting cmState = iota // its build is in the ConfigMap's data and it watches
	cmHolding                // it created the ConfigMap
	cmGaveUp                 // a newer build is waiting
)

// cmExpiry bounds a pod-less hold, as in the original.
const cmExpiry = time.Hour

// cmRetryPause is how long a contender waits before it tries again after a
// failed request.
const cmRetryPause = 200 * time.Millisecond

// stampLayout is RFC 3339 with a fixed nine-digit fraction, so that stamps
// in UTC sort as strings the way they sort as times (time.RFC3339Nano drops
// trailing zeros: "05.1Z" would sort after "05.12Z").
const stampLayout = "2006-01-02T15:04:05.000000000Z07:00"

var errNewerWaits = errors.New("a newer build is waiting already")

// cmBid is one build's bid for a target.
type cmBid struct {
	Target, Repo, Branch string
	Build                int64
	Stamp                time.Time
	Pod                  *corev1.Pod // the build's pod; nil for a pod-less build
}

func (b cmBid) data() map[string]string {
	return map[string]string{
		"repo": b.Repo, "branch": b.Branch, "build": strconv.FormatInt(b.Build, 10),
		"stamp": b.Stamp.UTC().Format(stampLayout),
	}
}

// id names the bid in the holder annotation: its line, build and stamp.
func (b cmBid) id() string {
	return fmt.Sprintf("%s@%s#%d %s", b.Repo, b.Branch, b.Build, b.Stamp.UTC().Format(stampLayout))
}

func (b cmBid) configMap(ns string) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "lock-" + b.Target, Annotations: map[string]string{"holder": b.id()}},
		Data:       b.data(),
	}
	if b.Pod != nil {
		cm.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: b.Pod.Name, UID: b.Pod.UID}}
	} else {
		cm.Annotations["expires"] = time.Now().Add(cmExpiry).UTC().Format(time.RFC3339Nano)
	}
	return cm
}

// outranks says whether mine must take the waiting slot from slot (the data
// in the ConfigMap): a newer build of the same line, or a later-started build
// of another line. An equal build is already in the slot; an older one gives
// up with errNewerWaits.
func outranks(slot, mine map[string]string) (bool, error) {
	if slot["repo"] == mine["repo"] && slot["branch"] == mine["branch"] {
		a, _ := strconv.ParseInt(slot["build"], 10, 64)
		b, _ := strconv.ParseInt(mine["build"], 10, 64)
		if a == b {
			return false, nil
		}
		if a > b {
			return false, errNewerWaits
		}
		return true, nil
	}
	if mine["stamp"] > slot["stamp"] { // stampLayout in UTC sorts as time
		return true, nil
	}
	return false, errNewerWaits
}

// cmLocker runs the protocol for the contenders of one namespace.
type cmLocker struct {
	cs kubernetes.Interface
	ns string
}

// acquire bids until b holds the lock (it returns the release function),
// gives up against a newer build (errNewerWaits), or ctx ends. report is
// told each state as the contender reaches it; retry, of each request that
// failed, and says whether to try again (a latency run would rather fail).
func (l *cmLocker) acquire(ctx context.Context, b cmBid, report func(cmState, time.Time), retry func(error) bool) (func(context.Context) error, error) {
	cms := l.cs.CoreV1().ConfigMaps(l.ns)
	holding := func(mine *corev1.ConfigMap) (func(context.Context) error, error) {
		report(cmHolding, time.Now())
		uid := mine.UID
		return func(ctx context.Context) error {
			return cms.Delete(ctx, mine.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		}, nil
	}
	pause := func(err error) error {
		if ctx.Err() != nil || !retry(err) {
			return err
		}
		select {
		case <-time.After(cmRetryPause):
			return nil
		case <-ctx.Done():
			return err
		}
	}
	lost := false // the last create's answer was lost: it may have been made
	for {
		mine, err := cms.Create(ctx, b.configMap(l.ns), metav1.CreateOptions{})
		if err == nil {
			return holding(mine)
		}
		if !apierrors.IsAlreadyExists(err) {
			if err := pause(fmt.Errorf("creating lock ConfigMap: %w", err)); err != nil {
				return nil, err
			}
			lost = true
			continue
		}
		if lost {
			cur, err := cms.Get(ctx, "lock-"+b.Target, metav1.GetOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				if err := pause(fmt.Errorf("reading lock ConfigMap after a lost create: %w", err)); err != nil {
					return nil, err
				}
				continue
			}
			if err == nil && cur.Annotations["holder"] == b.id() {
				return holding(cur)
			}
			lost = false
		}
		if err := l.negotiate(ctx, b, report); err != nil {
			if errors.Is(err, errNewerWaits) {
				report(cmGaveUp, time.Now())
				return nil, err
			}
			if err := pause(err); err != nil {
				return nil, err
			}
		}
	}
}

// negotiate waits on an existing lock; it returns nil when the lock may be
// free, so that the contender races to create it again.
func (l *cmLocker) negotiate(ctx context.Context, b cmBid, report func(cmState, time.Time)) error {
	cms := l.cs.CoreV1().ConfigMaps(l.ns)
	for {
		cur, err := cms.Get(ctx, "lock-"+b.Target, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		} else if err != nil {
			return fmt.Errorf("reading lock ConfigMap: %w", err)
		}
		holderPod, dead, err := l.holderEnded(ctx, cur)
		if err != nil {
			return err
		}
		if dead { // remove this lock, and only this one
			err := cms.Delete(ctx, cur.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &cur.UID}})
			if err == nil || apierrors.IsNotFound(err) {
				return nil
			} else if apierrors.IsConflict(err) {
				continue
			}
			return fmt.Errorf("removing ended lock ConfigMap: %w", err)
		}
		write, err := outranks(cur.Data, b.data())
		if err != nil {
			return err
		}
		if write {
			cur.Data = b.data()
			if cur, err = cms.Update(ctx, cur, metav1.UpdateOptions{}); apierrors.IsNotFound(err) {
				return nil
			} else if apierrors.IsConflict(err) {
				continue
			} else if err != nil {
				return fmt.Errorf("taking the waiting slot: %w", err)
			}
		}
		gone, err := l.watch(ctx, cur, holderPod, b, func() { report(cmWaiting, time.Now()) })
		if err != nil || gone {
			return err
		}
	}
}

// holderEnded reads the holder's pod live; a pod-less holder ends at its
// expiry.
func (l *cmLocker) holderEnded(ctx context.Context, cm *corev1.ConfigMap) (*corev1.Pod, bool, error) {
	if len(cm.OwnerReferences) == 0 {
		exp, err := time.Parse(time.RFC3339Nano, cm.Annotations["expires"])
		return nil, err == nil && time.Now().After(exp), nil
	}
	ref := cm.OwnerReferences[0]
	pod, err := l.cs.CoreV1().Pods(l.ns).Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, true, nil
	case err != nil:
		return nil, false, fmt.Errorf("reading the holder's pod: %w", err)
	}
	return pod, pod.UID != ref.UID || podEnded(pod), nil
}

func podEnded(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// watch follows the lock (from the version read) and its holder's pod until
// the lock is gone or the holder ended (gone), or the data changed (re-read).
func (l *cmLocker) watch(ctx context.Context, cm *corev1.ConfigMap, holderPod *corev1.Pod, b cmBid, watching func()) (gone bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lw, err := l.cs.CoreV1().ConfigMaps(l.ns).Watch(ctx, metav1.SingleObject(cm.ObjectMeta))
	if err != nil {
		return false, fmt.Errorf("watching lock ConfigMap: %w", err)
	}
	defer lw.Stop()
	var podEvents <-chan watch.Event
	var expiry <-chan time.Time
	if holderPod != nil {
		pw, err := l.cs.CoreV1().Pods(l.ns).Watch(ctx, metav1.SingleObject(holderPod.ObjectMeta))
		if err != nil {
			return false, fmt.Errorf("watching the holder's pod: %w", err)
		}
		defer pw.Stop()
		podEvents = pw.ResultChan()
	} else if exp, err := time.Parse(time.RFC3339Nano, cm.Annotations["expires"]); err == nil {
		t := time.NewTimer(time.Until(exp))
		defer t.Stop()
		expiry = t.C
	}
	watching()
	for {
		select {
		case ev, ok := <-lw.ResultChan():
			switch {
			case !ok || ev.Type == watch.Error:
				return false, nil
			case ev.Type == watch.Deleted:
				return true, nil
			}
			if write, err := outranks(ev.Object.(*corev1.ConfigMap).Data, b.data()); err != nil || write {
				return false, err
			}
		case ev, ok := <-podEvents:
			switch {
			case !ok || ev.Type == watch.Error:
				return false, nil
			case ev.Type == watch.Deleted || podEnded(ev.Object.(*corev1.Pod)):
				return true, nil
			}
		case <-expiry:
			return false, nil
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}
