package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/pkg/lock"
)

const releaseLong = `Release claims (delete their BuildLocks) by name, or this job's claims of this build
on a target (--mine: the build and run as acquire finds them, and only the claims
this job created, as its proof in the job's state directory or its pod shows; every
run's claims of the build with --run-id=). A claim already gone counts as released.
To end another build's hold, use force-release.

Exit codes: 0 released (or already gone), 1 error, 2 usage error.`

const releaseExample = `  kubectl buildlock release acme-shop-main-42-staging -n ci

  # In the final step of a pipeline (runs also when earlier steps failed)
  kubectl buildlock release --target staging --mine`

// releaseOptions is `kubectl buildlock release`.
type releaseOptions struct {
	f                 *factory
	names             []string
	target, namespace string
	mine              bool
	build             buildFlags
	podUID            string
}

func newReleaseCommand(o *releaseOptions) *cobra.Command {
	cmd := newCommand(o, "release (NAME... | --target T --mine)",
		"Release claims (delete their BuildLocks)", releaseLong, releaseExample)
	cmd.ValidArgsFunction = o.f.completeClaims
	addTargetFlag(cmd, o.f, &o.target, "With --mine: the target whose claims to release.")
	cmd.Flags().BoolVar(&o.mine, "mine", false, "Release this job's claims of this build on --target (the build and run as acquire finds them: flags, else CI variables).")
	o.build.addFlags(cmd.Flags())
	return cmd
}

func (o *releaseOptions) Complete(cmd *cobra.Command, args []string) error {
	o.names = args
	ci := lock.DetectCI(o.f.env)
	o.build.complete(cmd.Flags(), ci, o.f)
	o.podUID = ci.PodUID
	var err error
	o.namespace, err = o.f.namespace()
	return err
}

func (o *releaseOptions) Validate() error {
	switch {
	case len(o.names) > 0 && (o.target != "" || o.mine):
		return errors.New("give either BuildLock names, or --target with --mine, not both")
	case len(o.names) == 0 && (o.target == "" || !o.mine):
		return errors.New("give a BuildLock name, or --target T --mine for this run's claims (to end another build's hold, use force-release)")
	case len(o.names) == 0 && len(o.build.missing()) > 0:
		return errors.New("--mine needs the build's repo, branch and build: pass --repo, --branch and --build, or run in CI")
	}
	return nil
}

func (o *releaseOptions) Run(ctx context.Context) error {
	c, err := o.f.client()
	if err != nil {
		return err
	}
	var released []lock.Released
	var others []buildlockv1.BuildLock
	if len(o.names) > 0 {
		var errs []error
		for _, name := range o.names {
			r, err := lock.ReleaseName(ctx, c, o.namespace, name)
			switch {
			case err != nil:
				errs = append(errs, err)
			case r == nil:
				fmt.Fprintf(o.f.streams.ErrOut, "BuildLock %s/%s does not exist; nothing to release.\n", o.namespace, name)
			default:
				released = append(released, *r)
			}
		}
		err = errors.Join(errs...)
	} else {
		if o.mine && o.build.runID == "" {
			fmt.Fprintln(o.f.streams.ErrOut, "No run id (--run-id=): releasing every claim of this build.")
		}
		b := o.build
		released, others, err = lock.ReleaseBuild(ctx, c, lock.BuildRef{
			Namespace: o.namespace, Target: o.target, Repo: b.repo, Branch: b.branch, Workflow: b.workflow, Build: b.build,
			RunID: b.runID, PodUID: o.podUID, StateDir: b.stateDir})
		if len(released)+len(others) == 0 && err == nil {
			fmt.Fprintf(o.f.streams.ErrOut, "No claim of build %d of %s@%s on %s in %s; nothing to release.\n", b.build, b.repo, b.branch, o.target, o.namespace)
		}
	}
	for _, r := range released {
		if r.Gone {
			fmt.Fprintf(o.f.streams.ErrOut, "BuildLock %s/%s is already gone.\n", r.BuildLock.Namespace, r.BuildLock.Name)
		} else {
			fmt.Fprintf(o.f.streams.ErrOut, "Released BuildLock %s/%s (%s).\n", r.BuildLock.Namespace, r.BuildLock.Name, describeClaim(r.BuildLock))
		}
	}
	for i := range others {
		bl := &others[i]
		why := fmt.Sprintf("it is another run's (run %q, this is run %q)", lock.RunIDOf(bl), o.build.runID)
		if lock.RunIDOf(bl) == o.build.runID {
			why = fmt.Sprintf("it has this run's id %q, but this job did not create it (no proof of it in %s): another job computes the same run id; "+
				"release it by name if it is yours", o.build.runID, o.build.stateDir)
		}
		fmt.Fprintf(o.f.streams.ErrOut, "Left BuildLock %s/%s (%s): %s.\n", bl.Namespace, bl.Name, describeClaim(bl), why)
	}
	return err
}

// describeClaim is lock.Describe and how the claim stands.
func describeClaim(bl *buildlockv1.BuildLock) string {
	if bl.Status.Phase == buildlockv1.PhaseHeld {
		return fmt.Sprintf("%s, Held with token %d", lock.Describe(bl), bl.Status.FencingToken)
	}
	return fmt.Sprintf("%s, %s", lock.Describe(bl), cmp.Or(bl.Status.Phase, buildlockv1.PhasePending))
}

var forceReleaseLong = fmt.Sprintf(`Ask the operator to end the current hold of a target, recording who and why.

The holding BuildLock is annotated %s="<who>: <reason>" (who is your user
name, as the API server sees it) and a Warning event %s is recorded on it. The
operator then releases the hold (phase Released, reason ForceReleased) and grants
the lock to the next waiting build. A plugin running a command under that hold
stops the command and exits 5.

The reason is at most %d characters, without control characters.

Needs list and patch on buildlocks and create on events in the namespace.

Exit codes: 0 requested, 1 error or no holder, 2 usage error.`,
	buildlockv1.ForceReleaseAnnotation, lock.EventReasonForceRelease, buildlockv1.MaxForceReleaseReasonLength)

const forceReleaseExample = `  kubectl buildlock force-release -n ci --target staging --reason "deploy hangs since 09:12, INC-123"`

// forceReleaseOptions is `kubectl buildlock force-release`.
type forceReleaseOptions struct {
	f                         *factory
	target, reason, namespace string
}

func newForceReleaseCommand(o *forceReleaseOptions) *cobra.Command {
	cmd := newCommand(o, "force-release --target T --reason TEXT", "Ask the operator to end the current hold of a target",
		forceReleaseLong, forceReleaseExample)
	cmd.Args = cobra.NoArgs
	addTargetFlag(cmd, o.f, &o.target, "The target whose hold to end (required).")
	cmd.Flags().StringVar(&o.reason, "reason", "", fmt.Sprintf("Why, for the record (required; at most %d characters).", buildlockv1.MaxForceReleaseReasonLength))
	return cmd
}

func (o *forceReleaseOptions) Complete(*cobra.Command, []string) error {
	o.reason = strings.TrimSpace(o.reason)
	var err error
	o.namespace, err = o.f.namespace()
	return err
}

func (o *forceReleaseOptions) Validate() error {
	if o.target == "" {
		return errors.New("--target is required")
	}
	if err := lock.ValidateReason(o.reason); err != nil {
		return fmt.Errorf("--reason: %w", err)
	}
	return nil
}

func (o *forceReleaseOptions) Run(ctx context.Context) error {
	c, err := o.f.client()
	if err != nil {
		return err
	}
	r, err := lock.ForceRelease(ctx, c, o.namespace, o.target, o.reason)
	if errors.Is(err, lock.ErrNoHolder) {
		return fmt.Errorf("%w; nothing to force-release (see kubectl buildlock status)", err)
	}
	if err != nil {
		return err
	}
	stderr, h := o.f.streams.ErrOut, r.Holder
	fmt.Fprintf(stderr, "Annotated BuildLock %s/%s (%s) with %s=%q.\n",
		h.Namespace, h.Name, describeClaim(h), buildlockv1.ForceReleaseAnnotation, r.Value)
	if r.EventErr != nil {
		fmt.Fprintf(stderr, "warning: %v\n", r.EventErr)
	} else {
		fmt.Fprintf(stderr, "Recorded Warning event %s on it: %s\n", r.Event.Reason, r.Event.Message)
	}
	fmt.Fprintf(stderr, "The operator ends the hold at its next decision (Released, reason ForceReleased) and grants %s to the next waiting build, if any.\n", o.target)
	return nil
}
