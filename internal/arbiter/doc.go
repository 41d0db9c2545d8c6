// Package arbiter decides, for one lock (one namespace and deploy target),
// what every claim's state must be.
//
// [Decide] is a pure function of the lock's claims, what is known of their
// pods, the grant record, the instant now and the operator's [Policy]. It
// reads no clock, keeps no state, logs nothing and starts nothing: it returns
// a [Decision], a value the controller applies (grant first, then statuses, in
// the order of Decision.Verdicts).
//
// # Phases
//
// A claim starts Pending (an empty phase counts as Pending) and can move:
//
//	Pending → Held, Waiting, Superseded or Released
//	Waiting → Held, Superseded or Released (or Expired: a claim the grant
//	          names whose Held status was never written, when the hold ran out)
//	Held    → Released or Expired
//
// Superseded, Released and Expired are terminal.
//
// # Rules
//
// These rules are the product's contract.
//
//  1. One holder. At most one claim is Held, and it is the claim the grant
//     names. A claim shown Held that the grant does not name (the grant moved
//     on without its end being written) ends Released: with reason
//     PodFinished or PodGone when its pod says so, else LockLost.
//  2. No pre-emption. The holder is the non-terminal claim whose Name and UID
//     are the grant's Holder and HolderUID. It keeps the lock until its pod
//     finished (Released, reason PodFinished) or is gone (Released, PodGone);
//     or, with no pod, until now ≥ max(grant.AcquiredAt, RenewTime) +
//     ExpiresAfter (Expired, Expired); or, with a pod, while Policy.MaxHold > 0,
//     until now ≥ grant.AcquiredAt + MaxHold (Expired, MaxHoldExceeded). From
//     80 % of MaxHold on, a pod-backed holder's verdict carries a Warning. A
//     grant that names no such claim (deleted, or recreated with another UID)
//     has no holder: the lock is free for this decision. Newer builds never
//     take the lock from a live holder.
//  3. Same line, newer build wins. A line is Repo+Branch. The Pending and
//     Waiting claims left by rules 1, 2 and 6 are candidates. A candidate of
//     the live holder's line with a lower Build is Superseded
//     (SupersededByNewerBuild), with the same Build Superseded
//     (DuplicateBuild), both by the holder. Among the candidates of one line
//     only the highest Build survives; lower builds are Superseded
//     (SupersededByNewerBuild) by the survivor. Of equal builds the earliest
//     keeps its place (the one already Waiting, then the earlier Created, then
//     the smaller Name) and the others are Superseded (DuplicateBuild) by it.
//  4. Different lines, newer build wins the slot. The survivors, at most one
//     per line, are ranked by [Newer]. With a live holder, the first takes the
//     single waiting slot (Waiting, WaitingForHolder) and every other is
//     Superseded (SupersededByNewerBuild) by it. The holder itself supersedes
//     no claim of another line: those compete only for the slot.
//  5. Hand-off. Without a live holder (the lock was free, or its holder ended
//     in this very decision) the first survivor is granted the lock at once
//     (Held, Acquired), the second takes the slot, and the rest are
//     Superseded by the slot's claim. The first survivor is the claim that
//     waited, unless a newer one arrived since it was last decided. The
//     grant's fencing token is one above the highest known: the grant's and
//     every input claim's, terminal ones included, so that a token is never
//     reused even if the grant record was lost. A freed lock keeps that
//     highest token as its floor.
//  6. A waiter that dies leaves. A Pending or Waiting claim whose pod finished
//     or is gone becomes Released with reason PodFinished or PodGone.
//     A claim that a person force-released (Claim.ForceRelease) leaves too,
//     holder or waiter: Released, reason ForceReleased.
//  7. Terminal is terminal. A Superseded, Released or Expired claim never
//     changes: its verdict repeats its phase with an empty Reason, which means
//     "unchanged, keep the stored reason and message". It takes part in
//     nothing else. A hold that ends by its pod is Released, by time Expired.
//  8. Unknown is not dead. A pod whose state could not be read (PodUnknown)
//     counts as alive everywhere; only a positive observation (finished, or
//     gone) releases a claim.
//  9. Stable. The decision does not depend on the order of the claims, and it
//     is a fixed point: applying it ([Decision.Apply], and Decision.Grant as
//     the grant) and deciding again at the same instant changes no phase,
//     leaves the grant as it is, and names the same holder and waiting claim.
//
// Decide settles terminal claims (7), the holder (2), other claims shown
// Held (1) and dead waiters (6) first; then lines (3), then the slot and the
// hand-off (4, 5).
//
// Waiting and Pending claims have no expiry of their own: ExpiresAfter bounds
// a hold, and counts from the grant.
//
// # Writing a decision
//
// When GrantChanged is set, the controller must compare-and-swap the grant
// record before writing any status. Decision.Verdicts lists claims that stop
// holding first, then the others by name, and the claim that becomes Held
// last, so that no two claims are shown holding at any point of the writes.
// NextLook is the earliest instant after now at which time alone would change
// the decision: a pod-less holder's expiry, or a pod-backed holder's 80 % and
// 100 % MaxHold points.
package arbiter
