// Package lock lets a Go program take a buildlock: it creates a BuildLock
// (one build's claim on one deploy target), watches it until the operator's
// verdict, and hands back a release function and the hold's fencing token.
//
//	release, token, err := lock.Acquire(ctx, c, lock.Claim{
//		Namespace: "ci", Target: "staging",
//		Repo: "acme/shop", Branch: "main", Build: 42,
//	})
//	switch {
//	case errors.Is(err, lock.ErrSuperseded):
//		return nil // a newer build will deploy; this one stops here
//	case err != nil:
//		return err
//	}
//	defer release(context.Background())
//	deploy(token)
//
// The outcomes are typed errors, usable with errors.Is and errors.As:
// [ErrSuperseded] ([*SupersededError]), [ErrEnded] ([*EndedError]),
// [ErrTimeout] ([*TimeoutError]) and [ErrInvalidClaim].
//
// A claim without a pod is kept alive by this process: while it waits and
// while it holds, a goroutine bumps spec.renewTime every third of
// spec.expiresAfter, so that the hold expires on its own when the process
// dies. [Hold.Release] stops it. A claim with a pod lives as long as the pod.
//
// [DetectCI] reads the usual CI variables (Tekton and Jenkins X, GitHub
// Actions, GitLab CI, Jenkins) into a Claim; [Name] derives a claim's
// BuildLock name. The kubectl-buildlock plugin is built on this package.
package lock
