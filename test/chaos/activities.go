package chaos

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// This file holds the checker's rules on what the holders did with their
// locks, as the processes that deployed recorded it: no two deployers
// write into one target at once, no two jobs share a claim, and a command
// dies with the plugin that runs it.

// The kinds of Activity.
const (
	// ActivityCommand is a command run by `kubectl buildlock acquire --
	// CMD`: from its first stamp to its last.
	ActivityCommand = "command"
	// ActivityJob is a job's deploy under pkg/lock: from the hold to its
	// release, or to when the job saw the hold lost.
	ActivityJob = "job"
	// ActivityWrite is one write into an enforced target that admission
	// let through: from when it was sent to its reply.
	ActivityWrite = "write"
)

// Activity is one stretch of deploying into a target, recorded by the
// process that deployed (in real time: no warp moves it).
type Activity struct {
	Kind string
	Lock LockKey
	// Claim is the BuildLock it deployed under and Token the fencing token
	// it was given (0: unknown, for the writes of the deployer, which the
	// enforced-holder-only rule judges against the Lease).
	Claim string
	Token int64
	// Job names the process or job that deployed: two jobs never share a
	// claim.
	Job        string
	Start, End time.Time
	// Killed is when the plugin that ran the command was SIGKILLed (zero:
	// it was not), and Grace its --grace-period: the command must be gone
	// by then.
	Killed time.Time
	Grace  time.Duration
	// Excused says why this activity may overlap another's (a person
	// named its claim in the grant Lease by hand, which the operator
	// undoes); "" for none.
	Excused string
}

func (a Activity) String() string {
	s := fmt.Sprintf("%s %s of %s (token %d, %s) %s–%s", a.Kind, a.Job, a.Claim, a.Token, a.Lock,
		a.Start.Format("15:04:05.000"), a.End.Format("15:04:05.000"))
	if !a.Killed.IsZero() {
		s += fmt.Sprintf(", plugin killed at %s", a.Killed.Format("15:04:05.000"))
	}
	return s
}

// killSlack is how long after the grace period a killed plugin's command
// may still be seen running: the supervisor's SIGKILL, the command's last
// stamp.
const killSlack = time.Second

// CheckActivities judges the activities, once the watches have caught up:
//
//   - one-deployer: two activities of different claims on one target
//     overlap by at most window (a holder stops when it sees its claim
//     end, which is written just after the grant moves on); and a command
//     or a job deploys only with a token the grant Lease gave its claim;
//   - claim-per-job: two jobs never deploy under one claim's grant at once;
//   - command-dies-with-plugin: a command ends within its grace period
//     (and a second) of its plugin's SIGKILL.
//
// It returns the figures: the activities by kind, the longest overlap, and
// the longest a command outlived its plugin.
func (c *Checker) CheckActivities(acts []Activity, window time.Duration) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	byLock := map[LockKey][]Activity{}
	kinds := map[string]int{}
	var outlived time.Duration
	killed := 0
	for _, a := range acts {
		byLock[a.Lock] = append(byLock[a.Lock], a)
		kinds[a.Kind]++
		if !a.Killed.IsZero() {
			killed++
			outlived = max(outlived, a.End.Sub(a.Killed))
		}
		c.checkActivity(a)
	}
	var longest time.Duration
	keys := make([]LockKey, 0, len(byLock))
	for k := range byLock {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
	for _, k := range keys {
		longest = max(longest, c.checkOverlaps(k, byLock[k], window))
	}
	var parts []string
	for _, kind := range []string{ActivityCommand, ActivityJob, ActivityWrite} {
		parts = append(parts, fmt.Sprintf("%s=%d", kind, kinds[kind]))
	}
	return fmt.Sprintf("%s; longest overlap of two claims on one target %s (allowed %s); %d plugins killed, their commands gone at most %s after",
		strings.Join(parts, ", "), longest.Round(time.Millisecond), window, killed, outlived.Round(time.Millisecond))
}

// checkActivity judges one activity alone: a killed plugin's command ended
// in time, and a command or a job held a grant of its claim.
func (c *Checker) checkActivity(a Activity) {
	if !a.Killed.IsZero() && a.End.After(a.Killed.Add(a.Grace+killSlack)) {
		e := c.record(Entry{At: c.o.Now(), Kind: "Check", Lock: a.Lock, Name: a.Claim, What: "command after its plugin was killed"})
		c.violate(e, "command-dies-with-plugin", "%s ran on %s after its plugin was SIGKILLed (grace period %s)",
			a, a.End.Sub(a.Killed).Round(time.Millisecond), a.Grace)
	}
	if a.Kind != ActivityWrite && a.Token > 0 && !c.granted(a.Lock, a.Claim, a.Token) {
		e := c.record(Entry{At: c.o.Now(), Kind: "Check", Lock: a.Lock, Name: a.Claim, What: "activity without a grant"})
		c.violate(e, "one-deployer", "%s deployed with token %d, which the grant Lease never gave %s", a, a.Token, a.Claim)
	}
}

// checkOverlaps judges lock k's activities pairwise and returns the longest
// overlap of two claims' activities that no person's edit excuses.
func (c *Checker) checkOverlaps(k LockKey, list []Activity, window time.Duration) time.Duration {
	var longest time.Duration
	sort.Slice(list, func(i, j int) bool { return list[i].Start.Before(list[j].Start) })
	for i, a := range list {
		for _, b := range list[i+1:] {
			if !b.Start.Before(a.End) {
				break // sorted by start: no later one overlaps a
			}
			overlap := earlierOf(a.End, b.End).Sub(b.Start)
			switch {
			case a.Claim == b.Claim && a.Token == b.Token && a.Job != b.Job && a.Kind != ActivityWrite:
				e := c.record(Entry{At: c.o.Now(), Kind: "Check", Lock: k, Name: a.Claim, What: "a claim shared"})
				c.violate(e, "claim-per-job", "two jobs deployed under one claim's grant at once: %s; %s", a, b)
			case a.Claim == b.Claim, a.Excused != "" || b.Excused != "":
			default:
				longest = max(longest, overlap)
				if overlap > window {
					e := c.record(Entry{At: c.o.Now(), Kind: "Check", Lock: k, Name: b.Claim, What: "two deployers"})
					c.violate(e, "one-deployer", "two deployers wrote into %s at once for %s (allowed: %s, for a holder to see its claim end): %s; %s",
						k.Target, overlap.Round(time.Millisecond), window, a, b)
				}
			}
		}
	}
	return longest
}

// granted reports whether lock k's grant Lease ever named claim name with
// token, or issued token while the checker's Lease watch was down. Call
// with c.mu held.
func (c *Checker) granted(k LockKey, name string, token int64) bool {
	lv := c.locks[k]
	if lv == nil {
		return false
	}
	if inGap(lv.gapTokens, token) {
		return true
	}
	suffix := fmt.Sprintf("#%d", token)
	for key := range lv.grants {
		if strings.HasPrefix(key, name+"/") && strings.HasSuffix(key, suffix) {
			return true
		}
	}
	return false
}
