// Package arbiter decides, for one lock (one namespace and deploy target),
// what every claim's state must be.
//
// [Decide] is a pure function of the lock's claims, what is known of their
// pods, the grant record, the instant now and the lock's [Policy] (its
// ordering and maximum hold). It reads no clock, keeps no state, logs
// nothing and starts nothing: it returns a [Decision], a value the
// controller applies (grant first, then statuses, in the order of
// Decision.Verdicts).
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
// # Orderings
//
// The ordering (Policy.Ordering) only decides who waits and who goes next;
// rules 1–3 and 6–11 hold in every ordering.
//
//   - NewestWins (the default, also for ""): one waiting slot for the whole
//     lock. Within a line (Repo+Branch+Workflow) only the newest build stays in the
//     running; across lines the newest build by [OrderTime] takes the slot
//     and every other gives up. Right for a GitOps environment repository,
//     where each build carries the whole desired state.
//   - Queue: one place per line in a first-come queue. Within a line only
//     the newest build stays, and it keeps its line's place; across lines
//     nobody supersedes anybody, and lines take the lock in the order of
//     their places. A line whose build holds joins at the back with its next
//     build. So a line that joins with k lines ahead of it holds after at
//     most k+1 hand-offs, however busy the other lines are.
//   - Fifo: every build takes its turn in the order it joined, several
//     builds of one line included.
//
// A change of ordering applies at the next decision: to NewestWins, the
// newest waiting claim keeps the slot and the others give up; from Queue to
// Fifo every claim keeps its place; from Fifo to Queue each line keeps one
// place, its earliest, taken by its newest build, and the line's older
// builds give up, as under Queue they always do.
//
// # Rules
//
// These rules are the product's contract.
//
//  1. One holder. At most one claim is Held, and it is the claim the grant
//     names. A claim shown Held that the grant does not name (the grant moved
//     on without its end being written) ends as the grant record's Ended
//     says when it names the claim; else Released with reason PodFinished or
//     PodGone when its pod says so, else LockLost.
//  2. No pre-emption. The holder is the non-terminal claim whose Name and UID
//     are the grant's Holder and HolderUID (as rule 11 restores the grant).
//     It keeps the lock until its pod finished (Released, reason
//     PodFinished) or is gone (Released, PodGone), it was deleted and only a
//     finalizer keeps it (Released, Deleted), a person force-released it
//     (Released, ForceReleased), or time ends it:
//     with no pod, at max(grant.AcquiredAt, renewal) + ExpiresAfter
//     (Expired, Expired); with or without a pod, while Policy.MaxHold > 0,
//     at grant.AcquiredAt + MaxHold (Expired, MaxHoldExceeded), whichever
//     comes first. A renewal counts from when the operator observed it:
//     RenewedAt, or min(RenewTime, now) for a renewal not recorded yet — a
//     client's clock in the future extends nothing. From 80 % of MaxHold on,
//     the holder's verdict carries a Warning. A grant that names no such
//     claim (deleted, or recreated with another UID) has no holder: the lock
//     is free for this decision. Newer builds never take the lock from a
//     live holder.
//  3. Never backwards, and branches belong to identities. A line is
//     Repo+Branch+Workflow (Workflow is what the CI system numbers builds
//     in; claims without one are of the line of Repo and Branch); its
//     branch is Repo+Branch, whatever the workflow. A rollback
//     (Claim.Rollback) that Policy.Rollbacks does not allow from its
//     Identity is Superseded (RollbackNotAllowed): RollbacksPeopleOnly
//     allows a verified Identity that is not a pipeline's only, so an
//     unverified one fails closed. A claim is judged by the builds of its
//     own line and, when its Workflow is one nothing verified
//     (Claim.WorkflowVerified), by those of its branch's line without a
//     workflow too (judgedOn): naming a workflow never gets a build past
//     what it would face without one. A Pending or Waiting claim left by
//     rules 1, 2 and 7 of the live holder's build of a line it is judged on
//     is Superseded by the holder (DuplicateBuild: two runs of one build
//     never go at once), and one below it too (SupersededByNewerBuild),
//     unless it is a rollback. Likewise, with no claim named, a claim that
//     is not a rollback below the remembered build of a line it is judged
//     on (SupersededByNewerBuild), or at it while Policy.RefuseReruns
//     (DuplicateBuild): the highest build of the line granted within
//     Policy.LineMemory since the line's last rollback, by the grant record
//     (Grant.Lines; LineRecord.Since is that rollback) or by a claim (one
//     whose status shows a token and an acquire time, or the one the grant
//     names; a rollback's rolled its line back when granted). So a re-run
//     of the build that held last (the same number, another claim) is
//     granted like any build once the earlier run's claim has ended,
//     unless a higher build of the line held since. A claim that is not a
//     rollback is Superseded (SupersededByNewerBuild) when the remembered
//     build of another line of its branch started after it
//     (LineRecord.Started against its [Policy.OrderTime]), among those
//     granted since the branch's last rollback (of any of its lines): a
//     branch never deploys an older build after a newer one, whatever
//     their workflows. A claim not refused so is Superseded, with no claim
//     named, when its branch's latest grant (of any of its lines) went to
//     a pipeline (LineRecord.Owner; see IsPipeline: a service account or a
//     CI identity) and the claim's Identity is another pipeline
//     (LineOwnedByOther): a branch belongs to the pipeline that held it
//     last, and a person's hold frees it; or, unless its Identity is a
//     person's, when its build is more than Policy.MaxBuildJump above its
//     line's remembered one (BuildJumpTooLarge). A claim with no Identity
//     (unverified) owns nothing and is bound by the rest. A rollback is
//     exempt from "never backwards" (by number and by start) and from
//     nothing else: the branch's owner, the jump, one holder, no
//     pre-emption and the ordering bind it as any claim. The others are
//     candidates. Rule 6 applies the same to claims ranked behind a new
//     holder of their branch, as its record will.
//  4. Newest of a line. With NewestWins and Queue, among the candidates of
//     one line only the highest Build survives; lower builds are Superseded
//     (SupersededByNewerBuild) by the survivor. Of equal builds the earliest
//     keeps its place (the one already Waiting, then the earlier Created,
//     then the smaller Name) and the others are Superseded (DuplicateBuild)
//     by it. A rollback ranks by its build like any claim: a higher build
//     of its line that waits supersedes it. With Queue the survivor takes
//     the earliest place that a claim of its line had. With Fifo, candidates
//     are taken in the order of their places, and one of the same build as
//     a claim of its line ahead of it is Superseded by that claim
//     (DuplicateBuild), and one below the highest build of its line ahead
//     (SupersededByNewerBuild) unless it is a rollback; a rollback ahead
//     lowers nothing for the claims behind it.
//  5. Ranking. NewestWins ranks the survivors by [Newer]; Queue and Fifo by
//     place (QueuedAt; a claim without one joins at now), and claims that
//     join in the same decision by [OrderTime], then Created, then identity.
//  6. Hand-off. Without a live holder (the lock was free, or its holder
//     ended in this very decision) the first ranked survivor whose build
//     the line memory would remember is granted the lock at once (Held,
//     Acquired); with NewestWins, the newest such. A survivor whose line is
//     new to the memory and does not fit its budgets is not granted: it
//     waits (Waiting, LineMemoryFull) with its place until records leave
//     the memory, since a build not remembered would let a lower build of
//     its line deploy after it. With NewestWins the newest other survivor
//     takes the single waiting slot (Waiting, WaitingForHolder) and every
//     other is Superseded (SupersededByNewerBuild) by it; with Queue and
//     Fifo all the others wait (Waiting, Queued) with their places. The
//     grant's fencing token is one above the highest known: the grant's
//     and every input claim's, terminal ones included, the grant's Floor
//     (what the operator knows was issued besides) and its Reserved (the
//     bound the namespace's token floor keeps of every token issued
//     there), so that a token is never reused even if the grant record was
//     lost. A freed lock keeps that highest token as its floor. The grant
//     records the granted build in Lines (with the new holder's Identity as
//     its Owner and its OrderTime as its Started; a rollback's build
//     replaces its line's record, whatever it was, and sets its Since),
//     how the previous hold ended in Ended, and the new holder's Writer;
//     and it appends to Audit what must outlive the claims: a hold that
//     ended because a person force-released it, and a grant to a rollback,
//     to a person's claim that rule 3 would have refused a pipeline, or
//     through a freeze by an override (rule 12) (the last two are
//     overrides), keeping the newest MaxAuditEntries. Lines keeps every line
//     it had that still counts, raised to what the claims show; a line gets
//     a new record only while the records stay within LineMemoryBytes, and
//     their owner's within LineMemoryBytesPerOwner (the grant's own record
//     always, as it was granted for having room): no record is ever
//     evicted to make room, so no claim can flush another line's memory,
//     and every build granted is remembered.
//  7. A waiter that dies leaves. A Pending or Waiting claim whose pod finished
//     or is gone becomes Released with reason PodFinished or PodGone.
//     A claim that a person force-released (Claim.ForceRelease) leaves too,
//     holder or waiter: Released, reason ForceReleased; and so does a claim
//     being deleted (Claim.Deleting): Released, reason Deleted.
//  8. Terminal is terminal. A Superseded, Released or Expired claim never
//     changes: its verdict repeats its phase with an empty Reason, which means
//     "unchanged, keep the stored status". It takes part in nothing else.
//  9. Unknown is not dead. A pod whose state could not be read (PodUnknown)
//     counts as alive everywhere; only a positive observation (finished, or
//     gone) releases a claim.
//  10. Stable. The decision does not depend on the order of the claims, and it
//     is a fixed point: applying it ([Decision.Apply], and Decision.Grant as
//     the grant) and deciding again at the same instant changes no phase,
//     leaves the grant as it is, and names the same holder and waiting claims.
//  11. The claims vouch for the grant record. Their statuses are written
//     only after the record, by the operator alone, so a record that
//     contradicts them was deleted or edited (by a person, or a careless
//     tool), and is restored (Decision.Repair, with GrantChanged). The
//     latest hold the claims show is that of the non-terminal claim shown
//     Held with a token and an acquire time, whose token is the highest of
//     every claim's, at least the grant's Floor, and at least the record's
//     Token if there is a record (a higher one is a later grant). If the
//     record is absent (RepairRecreated), names another claim or one that
//     does not exist, or names nobody without recording that hold's end at
//     its token (RepairHolder), the record is that hold again, with its
//     claim's token, acquire time and Writer: the same hold, not LockLost.
//     A record that names a claim shown Held takes that claim's token and
//     acquire time (RepairToken; an edited-up token stays as the Floor),
//     unless it is a later grant to that claim (a higher token, acquired
//     after the time its status shows), which stands; one
//     that names a claim not shown Held yet (granted, its status not
//     written) with a token below the one its Lines record of that grant
//     (its build, held at the record's acquire time) carries takes that
//     token back; else, with a token not above every other claim's, or
//     below its Floor, the next token above them (RepairToken). A record's
//     Writer is its holder's (RepairWriter). A restored record keeps in
//     Lines every build the claims show held; an absent record with nobody
//     holding is written again when there is such a build to remember
//     (RepairRecreated), and a record whose Lines lack one that a claim
//     other than its holder shows held (and that the budgets have room
//     for) gets it back (RepairLines). A record that names another claim with a token
//     above the holder's cannot be told from a hand-off made by another
//     manager, and stands (the holder shown is then LockLost, rule 1): only
//     admission can keep people from writing that.
//  12. A frozen target takes no grant. While Policy.Freeze says the target
//     is frozen (its policy's windows), no claim is granted, but through an
//     override: without a live holder, the first ranked survivor whose
//     Override is in effect (verified: the API server stamped who set it,
//     and that is not a service account; not expired; and expiring at most
//     MaxOverrideFor ahead) is granted (Held, Acquired; its verdict
//     Overridden), going ahead of the claims the freeze holds back, which
//     keep their places; a build of its line at or below it that was ahead
//     is Superseded by it (rule 3). Every other claim that waits has reason
//     Frozen and a message that says until when and why, but one whose
//     override is in effect, which keeps its reason and goes through the
//     freeze when its turn comes. An override pre-empts nobody, and is used
//     once: a claim is granted once. Nobody is pre-empted by a freeze
//     either: the holder keeps the lock, unless a Deny window in effect
//     that says holder: Release started after the hold's grant
//     (Freeze.ReleaseSince) and the holder has no verified override: then
//     it is Released with reason FreezeStarted. An override nothing
//     verified is void: its claim waits Frozen like any, and its message
//     says why. Newcomers queue or take the slot
//     as usual, and rules 1–11 hold as ever.
//
// Decide restores the grant record (11) first; then it settles terminal
// claims (8), the holder (2, 12), other claims shown Held (1) and waiters
// that leave (7); then builds that would deploy backwards or on another's
// branch (3), then lines (4), then the ranking and the hand-off (5, 6, 12).
//
// Waiting and Pending claims have no expiry of their own: ExpiresAfter and
// MaxHold bound a hold, and count from the grant.
//
// # What a hand-off writes
//
// A queued claim's verdict names neither the holder nor the first waiting
// claim (Verdict.Holder and Verdict.Waiting are empty), and its message names
// only the claim directly ahead of it, which stays true when that claim is
// granted. So a hand-off changes the verdicts of the old and the new holder
// only, however long the queue: the writes of a hand-off do not grow with
// it. A claim that leaves the queue changes at most the verdict of the claim
// behind it. The holder's verdict names no waiter (Verdict.Waiting is empty
// on a Held verdict): a claim that starts waiting, or replaces the waiter,
// changes its own verdict and the one it supersedes, never the holder's.
//
// # Writing a decision
//
// When GrantChanged is set, the controller must compare-and-swap the grant
// record before writing any status. Decision.Verdicts lists claims that stop
// holding first, then claims that stay in the running, then claims that end,
// and the claim that becomes Held last, so that no two claims are shown
// holding at any point of the writes, and a build that takes over its
// line's place records it before the build it replaces ends. NextLook is the
// earliest instant after now at which time alone would change the decision:
// a holder's expiry or maximum hold, or its 80 % warning point, or, while
// the target is frozen, when a waiting claim's override lapses or comes
// into effect, or, while a claim waits for room in the line memory, when
// its first record leaves it. The edges of the windows are the controller's to look for:
// Policy.Freeze is the state at now.
package arbiter
