// Package lock is the Go client of buildlock, and the kubectl-buildlock
// plugin is built on it: every operation on the API lives here once, and
// the plugin parses flags and prints.
//
// Acquire creates a BuildLock (one build's claim on one deploy target),
// watches it until the operator's verdict, and hands back a release function
// and the hold's fencing token:
//
//	c, _ := lock.NewClient(cfg)
//	release, token, err := lock.Acquire(ctx, c, lock.Claim{
//		Namespace: "ci", Target: "staging",
//		Repo: "acme/shop", Branch: "main", Build: 42,
//	})
//	switch {
//	case errors.Is(err, lock.ErrSuperseded):
//		return err // this build must not deploy: err says why, and what to do
//	case err != nil:
//		return err
//	}
//	defer release(context.Background())
//	deploy(token)
//
// The outcomes are typed errors, usable with errors.Is and errors.As:
// [ErrSuperseded] ([*SupersededError]), [ErrEnded] ([*EndedError]),
// [ErrTimeout] ([*TimeoutError]), [ErrClaimedByAnotherRun]
// ([*ClaimedByAnotherRunError]), [ErrLost] ([*LostError]),
// [ErrInvalidClaim], [ErrNameTaken], [ErrNoHolder] and [ErrInvalidReason].
//
// A Claim's Workflow puts it on its CI workflow's line (builds of two
// workflows are never compared), and its Rollback makes it a rollback on
// purpose (spec.rollback): it may deploy a build at or below one that
// already deployed, where the target's policy allows it. A re-run of a
// build (the same number, another run) is granted like any build once the
// earlier run's claim has ended.
//
// A claim belongs to the job that created it: a BuildLock carries its
// job's run id (buildlockv1.RunIDAnnotation) and the hash of a secret that
// the creating process keeps in the job's state directory
// (buildlockv1.RunProofAnnotation, Claim.StateDir), and Acquire attaches
// to an existing claim only when it names this run's pod by UID or when
// the secret proves it is this job's and the process that created it has
// ended without handing it over ([Hold.Detach]): a retried step. Two runs
// of one build, and two jobs that compute the same run id, never share a
// claim. A claim that is not this job's under the claim's name does not
// keep it out: Acquire claims under a fallback name that nobody can
// predict. [AcquireHold] returns a [Hold], whose WaitLost tells a holder
// that is still deploying when its claim was deleted or stopped holding, or
// its grant moved.
//
// A claim without a pod is kept alive by this process: while it waits and
// while it holds, a goroutine bumps spec.renewTime ([Renew]) every third of
// its expiresAfter (wait.JitterUntil: each up to 10% later), so that the
// hold expires on its own when the process dies; when no renewal succeeded
// for the renew deadline ([WithRenewDeadline]), WaitLost reports the hold
// lost before the claim can expire. [Hold.Release] stops it. A claim with a
// pod lives as long as the pod.
//
// [ReleaseName] and [ReleaseBuild] delete claims, [ForceRelease] asks the
// operator to end a hold, and [Status] summarizes locks: holder, fencing
// token, ordering and queue. Every write to an existing claim is guarded by
// its UID (write.go), so that it never lands on a newer claim of the same
// name.
//
// Watching uses client-go informers (as `kubectl wait` does): each lists,
// watches, and re-lists when its watch falls too far behind, instead of a
// hand-written watch loop; their first sync and every event wake the
// waiter at once (nothing polls). Acquire opens them while it creates the
// claim: on the lock's claims, and on the lock's grant Lease
// (buildlockv1.GrantLeaseName), so that it holds as soon as the Lease names
// the claim, one write before the claim's status says Held. It trusts only
// a grant the operator made, as far as a client can tell: the Lease carries
// the operator's label, names the claim, changed to name it while Acquire
// watched, and carries a token above every other it saw and, for a new
// Lease, above the namespace's token floor; the claim's status must then
// confirm it within [GrantConfirmTimeout]. Anything else waits for the
// status. [Hold.WaitLost] ends a hold when the grant Lease names another
// claim, nobody, or is deleted, whoever changed it (see grant.go).
//
// Validation uses the API's own values (api/v1alpha1's bounds and
// patterns), and a test proves that the API server accepts and refuses the
// same claims. [DetectCI] reads the usual CI variables (Tekton and Jenkins
// X, GitHub Actions, GitLab CI, Jenkins) into a Claim, a run id per job
// included; [LocalRunID] is the run id of a build acquired by hand; [Name]
// derives a claim's BuildLock name.
package lock
