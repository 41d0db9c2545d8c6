package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/pkg/lock"
)

var freezeLong = fmt.Sprintf(`Freeze a target now, for a while: no claim on it is granted until the freeze
ends (a build that holds it finishes), but through a person's override.

The freeze is a one-off Deny window added to the target's BuildLockPolicy
(created if there is none), named %s<start>, with your user name, as the API
server sees it, in frozenBy; the policy's status and kubectl get blp show it,
and the operator records an Event when the target freezes and opens again.
The reason is at most %d characters, without control characters.

Needs get, create and patch on buildlockpolicies: people, not pipelines.

Exit codes: 0 frozen, 1 error, 2 usage error.`, lock.FreezePrefix, buildlockv1.MaxWindowReasonLength)

const freezeExample = `  kubectl buildlock freeze -n ci staging --for 2h --reason "incident 4711"
  kubectl buildlock freeze -n ci staging --until 2026-12-28T08:00:00+01:00 --reason "holiday freeze"`

// freezeOptions is `kubectl buildlock freeze`.
type freezeOptions struct {
	f                         *factory
	target, reason, namespace string
	forDuration               time.Duration
	until                     string
	end                       time.Time
}

func newFreezeCommand(o *freezeOptions) *cobra.Command {
	cmd := newCommand(o, "freeze TARGET (--for DURATION | --until TIME) --reason TEXT", "Freeze a target: grant no claim on it for a while",
		freezeLong, freezeExample)
	cmd.Args = cobra.ExactArgs(1)
	cmd.ValidArgsFunction = o.f.completeTarget
	cmd.Flags().DurationVar(&o.forDuration, "for", 0, "How long the freeze lasts, from now (e.g. 2h).")
	cmd.Flags().StringVar(&o.until, "until", "", "When the freeze ends: an RFC 3339 time (e.g. 2026-12-28T08:00:00+01:00).")
	cmd.Flags().StringVar(&o.reason, "reason", "", "Why, for the record and every waiting claim's message (required).")
	cmd.MarkFlagsMutuallyExclusive("for", "until")
	return cmd
}

func (o *freezeOptions) Complete(_ *cobra.Command, args []string) error {
	o.target, o.reason = args[0], strings.TrimSpace(o.reason)
	var err error
	o.namespace, err = o.f.namespace()
	return err
}

func (o *freezeOptions) Validate() error {
	switch {
	case o.forDuration < 0:
		return errors.New("--for must be positive")
	case o.forDuration > 0:
		o.end = time.Now().Add(o.forDuration)
	case o.until != "":
		t, err := time.Parse(time.RFC3339, o.until)
		if err != nil {
			return fmt.Errorf("--until: %q is not an RFC 3339 time such as 2026-12-28T08:00:00+01:00", o.until)
		}
		o.end = t
	default:
		return errors.New("say how long: --for DURATION or --until TIME")
	}
	return validateReason(o.reason, "why the target is frozen: it is recorded, and every waiting claim's message shows it")
}

// validateReason checks the --reason of freeze and override: missing, it
// says what the reason is for (why).
func validateReason(reason, why string) error {
	if reason == "" {
		return fmt.Errorf("missing --reason: say %s", why)
	}
	if err := lock.ValidateWindowReason(reason); err != nil {
		return fmt.Errorf("--reason: %w", err)
	}
	return nil
}

func (o *freezeOptions) Run(ctx context.Context) error {
	c, err := o.f.client()
	if err != nil {
		return err
	}
	r, err := lock.Freeze(ctx, c, o.namespace, o.target, o.reason, time.Now(), o.end)
	if err != nil {
		return err
	}
	created := ""
	if r.Created {
		created = " (created the policy)"
	}
	fmt.Fprintf(o.f.streams.ErrOut, "Froze %s in %s until %s (%s): window %s of BuildLockPolicy %s%s, frozen by %s.\n",
		o.target, o.namespace, r.Window.End.Format(time.RFC3339), r.Window.Reason, r.Window.Name, o.target, created, r.Window.FrozenBy)
	fmt.Fprintf(o.f.streams.ErrOut, "Waiting claims keep their places; kubectl buildlock unfreeze -n %s %s lifts it.\n", o.namespace, o.target)
	return nil
}

const unfreezeLong = `Lift the ad-hoc freezes of a target (the windows kubectl buildlock freeze
added): its claims are granted again, in the order of its policy, unless
another of its windows keeps it closed. The policy's other windows stay.

Needs get and patch on buildlockpolicies.

Exit codes: 0 lifted, 1 error or no ad-hoc freeze, 2 usage error.`

// unfreezeOptions is `kubectl buildlock unfreeze`.
type unfreezeOptions struct {
	f                 *factory
	target, namespace string
}

func newUnfreezeCommand(o *unfreezeOptions) *cobra.Command {
	cmd := newCommand(o, "unfreeze TARGET", "Lift the ad-hoc freezes of a target", unfreezeLong, "  kubectl buildlock unfreeze -n ci staging")
	cmd.Args = cobra.ExactArgs(1)
	cmd.ValidArgsFunction = o.f.completeTarget
	return cmd
}

func (o *unfreezeOptions) Complete(_ *cobra.Command, args []string) error {
	o.target = args[0]
	var err error
	o.namespace, err = o.f.namespace()
	return err
}

func (o *unfreezeOptions) Validate() error { return nil }

func (o *unfreezeOptions) Run(ctx context.Context) error {
	c, err := o.f.client()
	if err != nil {
		return err
	}
	removed, err := lock.Unfreeze(ctx, c, o.namespace, o.target)
	if err != nil {
		return err
	}
	for _, w := range removed {
		fmt.Fprintf(o.f.streams.ErrOut, "Removed freeze %s (%s, by %s) from BuildLockPolicy %s/%s.\n", w.Name, w.Reason, w.FrozenBy, o.namespace, o.target)
	}
	return nil
}

var overrideLong = fmt.Sprintf(`Let one claim be granted through a freeze of its target: break-glass, for
people. The claim is granted once the lock is free (it pre-empts no holder),
ahead of the claims the freeze holds back, once; the override lapses unused
after --for (at most %s).

The BuildLock is annotated %s (the reason) and %s; the
API server stamps %s with your user name (the buildlock-override
admission policy, which also refuses service accounts). The operator records a
Warning event Overridden on the claim and counts it (buildlock_overrides_total).

Needs get and patch on buildlocks.

Exit codes: 0 overridden, 1 error, 2 usage error, 5 the claim has ended.`,
	buildlockv1.MaxOverrideFor, buildlockv1.OverrideAnnotation, buildlockv1.OverrideExpiresAnnotation, buildlockv1.OverriddenByAnnotation)

const overrideExample = `  kubectl buildlock override -n ci shop-main-42 --reason "hotfix for incident 4711"
  kubectl buildlock override -n ci shop-main-42 --reason "hotfix for incident 4711" --for 2h`

// overrideOptions is `kubectl buildlock override`.
type overrideOptions struct {
	f                        *factory
	claim, reason, namespace string
	forDuration              time.Duration
}

func newOverrideCommand(o *overrideOptions) *cobra.Command {
	cmd := newCommand(o, "override CLAIM --reason TEXT [--for DURATION]", "Let one claim be granted through a freeze, once",
		overrideLong, overrideExample)
	cmd.Args = cobra.ExactArgs(1)
	cmd.ValidArgsFunction = o.f.completeClaims
	cmd.Flags().StringVar(&o.reason, "reason", "", "Why, for the record (required).")
	cmd.Flags().DurationVar(&o.forDuration, "for", buildlockv1.DefaultOverrideFor, "How long the override lasts unused.")
	return cmd
}

func (o *overrideOptions) Complete(_ *cobra.Command, args []string) error {
	o.claim, o.reason = args[0], strings.TrimSpace(o.reason)
	var err error
	o.namespace, err = o.f.namespace()
	return err
}

func (o *overrideOptions) Validate() error {
	if o.forDuration <= 0 || o.forDuration > buildlockv1.MaxOverrideFor {
		return fmt.Errorf("--for must be positive and at most %s", buildlockv1.MaxOverrideFor)
	}
	return validateReason(o.reason, "why this claim goes through the freeze: it is recorded on the claim and in its event")
}

func (o *overrideOptions) Run(ctx context.Context) error {
	c, err := o.f.client()
	if err != nil {
		return err
	}
	now := time.Now()
	r, err := lock.Override(ctx, c, o.namespace, o.claim, o.reason, now, now.Add(o.forDuration))
	if err != nil {
		return err
	}
	fmt.Fprintf(o.f.streams.ErrOut, "Overrode the freeze for BuildLock %s/%s until %s (%s): it is granted once the lock is free.\n",
		r.Namespace, r.Name, r.Expires.Format(time.RFC3339), o.reason)
	return nil
}
