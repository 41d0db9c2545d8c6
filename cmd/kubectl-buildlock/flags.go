package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"

	"github.com/buildlock/buildlock/pkg/lock"
)

// buildFlags identify this build and this run, for acquire and release.
// What they leave out comes from the CI variables.
type buildFlags struct {
	repo, branch, workflow string
	build                  int64
	runID                  string
	// stateDir is where this job keeps its claims' proofs: the CI system's
	// job directory, else the temp directory.
	stateDir string
	// localRunID says the run id is this person's on this machine: no CI
	// system gave one.
	localRunID bool
}

func (b *buildFlags) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&b.repo, "repo", "", "The repository, owner/name (default: from CI variables).")
	fs.StringVar(&b.branch, "branch", "", "The branch that was built (default: from CI variables).")
	fs.Int64Var(&b.build, "build", 0, "The build number; higher is newer (default: from CI variables).")
	fs.StringVar(&b.workflow, "workflow", "", "What the CI system numbers builds in, where that is less than the repository: builds of two workflows "+
		"are never compared (default: $BUILDLOCK_WORKFLOW, else GitHub's GITHUB_WORKFLOW_REF without its @ref, the Jenkins job; "+
		"see docs/pipelines.md).")
	fs.StringVar(&b.runID, "run-id", "", "This job's run id: two jobs that share one must never share a claim, and a re-run never shares the first run's "+
		"(default: $BUILDLOCK_RUN_ID, else from CI variables, else <user>@<host>; see docs/pipelines.md).")
}

// complete fills what the flags left out from ci, and from f outside CI.
// Explicit flags win, even when empty.
func (b *buildFlags) complete(fs *pflag.FlagSet, ci lock.CI, f *factory) {
	defaultFrom(fs, "repo", &b.repo, ci.Repo)
	defaultFrom(fs, "branch", &b.branch, ci.Branch)
	defaultFrom(fs, "build", &b.build, ci.Build)
	defaultFrom(fs, "workflow", &b.workflow, ci.Workflow)
	defaultFrom(fs, "run-id", &b.runID, ci.RunID)
	if !fs.Changed("run-id") && b.runID == "" {
		b.runID, b.localRunID = f.localRunID(), true
	}
	b.stateDir = cmp.Or(ci.StateDir, f.env["TMPDIR"], os.TempDir())
}

// missing names the flags that neither the command line nor CI variables
// gave a value.
func (b *buildFlags) missing() []string {
	var missing []string
	for flag, unset := range map[string]bool{"--repo": b.repo == "", "--branch": b.branch == "", "--build": b.build == 0} {
		if unset {
			missing = append(missing, flag)
		}
	}
	slices.Sort(missing)
	return missing
}

// defaultFrom sets *v to value unless the flag name was given.
func defaultFrom[T any](fs *pflag.FlagSet, name string, v *T, value T) {
	if !fs.Changed(name) {
		*v = value
	}
}

// addTargetFlag adds --target, completed with the namespace's targets.
func addTargetFlag(cmd *cobra.Command, f *factory, target *string, usage string) {
	cmd.Flags().StringVar(target, "target", "", usage)
	_ = cmd.RegisterFlagCompletionFunc("target", f.completeTargets)
}

// addOutputFlags adds -o (and --template and the printers' other flags) to
// cmd: the formats of kubectl's printers, and extra ones the command prints
// itself.
func addOutputFlags(cmd *cobra.Command, p *genericclioptions.PrintFlags, extra ...string) {
	p.JSONYamlPrintFlags.AddFlags(cmd)
	p.NamePrintFlags.AddFlags(cmd)
	p.TemplatePrinterFlags.AddFlags(cmd)
	formats := slices.Concat(extra, p.AllowedFormats())
	cmd.Flags().StringVarP(p.OutputFormat, "output", "o", "", fmt.Sprintf("Output format. One of: (%s).", strings.Join(formats, ", ")))
	p.OutputFlagSpecified = func() bool { return cmd.Flags().Changed("output") }
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(formats, cobra.ShellCompDirectiveNoFileComp))
}

// printerFor returns the printer of p's -o, nil for the formats the
// command prints itself: own and the default "" (unless --template asks
// for a template without -o).
func printerFor(p *genericclioptions.PrintFlags, own ...string) (printers.ResourcePrinter, error) {
	template := p.TemplatePrinterFlags.TemplateArgument
	templateOnly := *p.OutputFormat == "" && template != nil && *template != ""
	if slices.Contains(append(own, ""), *p.OutputFormat) && !templateOnly {
		return nil, nil
	}
	printer, err := p.ToPrinter()
	if err != nil {
		return nil, usagef("%w", err)
	}
	return printer, nil
}

// completeTargets completes --target with the targets of the namespace's
// claims.
func (f *factory) completeTargets(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
	var targets []cobra.Completion
	for _, l := range f.completionLocks() {
		targets = append(targets, cobra.CompletionWithDesc(l.Target, describeLock(l)))
	}
	return slices.Compact(targets), cobra.ShellCompDirectiveNoFileComp
}

// completeTarget completes a command's one TARGET argument (freeze,
// unfreeze) with the namespace's targets.
func (f *factory) completeTarget(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return f.completeTargets(cmd, args, toComplete)
}

// completeClaims completes BuildLock names of the namespace.
func (f *factory) completeClaims(_ *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
	var names []cobra.Completion
	for _, l := range f.completionLocks() {
		for _, c := range l.Claims {
			if !slices.Contains(args, c.Name) {
				names = append(names, cobra.CompletionWithDesc(c.Name, fmt.Sprintf("%s on %s, %s", buildOf(&c), l.Target, c.Phase)))
			}
		}
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}

// completionLocks reads the namespace's locks for a completion; nothing when
// that fails (a completion has nowhere to report errors).
func (f *factory) completionLocks() []lock.Summary {
	c, err := f.client()
	if err != nil {
		return nil
	}
	ns, err := f.namespace()
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	locks, _ := lock.Status(ctx, c, ns, "")
	return locks
}
