package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/buildlock/buildlock/pkg/lock"
)

// errHelp says --help was asked for: print the command's help, exit 0.
var errHelp = flag.ErrHelp

// newFlagSet returns a flag set that reports nothing itself: the caller
// prints errors and help.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parseArgs parses flags placed anywhere among the positional arguments
// (kubectl's habit: `release NAME -n ci`), up to a "--", after which
// everything is the command to run. dash says whether "--" was there.
func parseArgs(fs *flag.FlagSet, args []string) (positional, command []string, dash bool, err error) {
	if i := slices.Index(args, "--"); i >= 0 {
		args, command, dash = args[:i], args[i+1:], true
	}
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, nil, false, errHelp
			}
			return nil, nil, false, usageErr{err}
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, command, dash, nil
		}
		positional, args = append(positional, args[0]), args[1:]
	}
}

// isSet reports whether the flag was given on the command line.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// acquireOptions is a parsed `acquire` command line.
type acquireOptions struct {
	kube kubeFlags
	// claim has everything but the namespace, which comes with the
	// connection.
	claim   lock.Claim
	timeout time.Duration
	// command runs while the lock is held, when given after "--".
	command []string
	// expiresAfterSet says --expires-after was given, so that the default
	// can depend on whether the claim has a pod.
	expiresAfterSet bool
	// podFromEnv says the pod came from HOSTNAME, not from --pod: it is
	// dropped when the pod runs in another namespace than the claims.
	podFromEnv bool
	// ci is what was found in the environment.
	ci lock.CI
}

// defaultCommandExpiresAfter is a pod-less claim's expiresAfter while the
// plugin runs a command and renews the claim every third of it: short, so
// that a hold whose plugin was killed ends soon.
const defaultCommandExpiresAfter = 2 * time.Minute

// parseAcquire parses `acquire`'s arguments, filling what the flags leave
// out from the CI variables in env. Explicit flags win, even when empty
// (--pod= claims without a pod).
func parseAcquire(args []string, env map[string]string) (acquireOptions, error) {
	var o acquireOptions
	fs := newFlagSet("acquire")
	o.kube.register(fs)
	fs.StringVar(&o.claim.Target, "target", "", "The namespace the build deploys into (required).")
	fs.StringVar(&o.claim.Repo, "repo", "", "The repository, owner/name (default: from CI variables).")
	fs.StringVar(&o.claim.Branch, "branch", "", "The branch that was built (default: from CI variables).")
	fs.Int64Var(&o.claim.Build, "build", 0, "The build number; higher is newer (default: from CI variables).")
	fs.StringVar(&o.claim.PodName, "pod", "", "The pipeline's pod, in the claims' namespace: while it runs the build is alive (default: $HOSTNAME when running in a pod). --pod= claims without a pod.")
	fs.StringVar(&o.claim.PodUID, "pod-uid", "", "The pod's UID, so that a replaced pod of the same name does not count.")
	fs.StringVar(&o.claim.Name, "name", "", "The BuildLock's name (default: derived from repo, branch, build and target).")
	fs.DurationVar(&o.timeout, "timeout", 0, "How long to wait for the lock before giving up (exit 4); 0 waits until interrupted.")
	fs.DurationVar(&o.claim.ExpiresAfter, "expires-after", 0, "For a claim without a pod: how long the hold lasts without renewal (10s to 24h). Default: 2m with -- CMD (renewed while it runs), else the API's 1h.")
	positional, command, dash, err := parseArgs(fs, args)
	if err != nil {
		return o, err
	}
	if len(positional) > 0 {
		return o, usagef("acquire takes no arguments, got %q; put the command to run after --", positional)
	}
	if dash && len(command) == 0 {
		return o, usagef("nothing after --: give the command to run while the lock is held")
	}
	o.command = command
	o.expiresAfterSet = isSet(fs, "expires-after")
	if o.timeout < 0 {
		return o, usagef("--timeout must not be negative")
	}

	o.ci = lock.DetectCI(env)
	if !isSet(fs, "repo") {
		o.claim.Repo = o.ci.Repo
	}
	if !isSet(fs, "branch") {
		o.claim.Branch = o.ci.Branch
	}
	if !isSet(fs, "build") {
		o.claim.Build = o.ci.Build
	}
	if !isSet(fs, "pod") {
		o.claim.PodName = o.ci.Pod
		o.podFromEnv = o.ci.Pod != ""
	}

	var missing []string
	if o.claim.Target == "" {
		missing = append(missing, "--target (the namespace the build deploys into)")
	}
	if o.claim.Repo == "" {
		missing = append(missing, "--repo (no GITHUB_REPOSITORY, CI_PROJECT_PATH, REPO_OWNER/REPO_NAME or JOB_NAME found)")
	}
	if o.claim.Branch == "" {
		missing = append(missing, "--branch (no GITHUB_REF_NAME, CI_COMMIT_REF_NAME, BRANCH_NAME or GIT_BRANCH found)")
	}
	if !isSet(fs, "build") && o.claim.Build == 0 {
		missing = append(missing, "--build (no GITHUB_RUN_NUMBER, CI_PIPELINE_IID or BUILD_NUMBER found)")
	}
	if len(missing) > 0 {
		return o, usagef("missing %s", strings.Join(missing, ", "))
	}
	return o, nil
}

// resolve completes the claim once the namespace is known. podNamespace is
// the namespace this process's pod runs in ("" if unknown): a pod found in
// HOSTNAME counts only in the claims' namespace, since podRef names a pod
// there. It returns notes worth telling the user.
func (o *acquireOptions) resolve(namespace, podNamespace string) (notes []string) {
	o.claim.Namespace = namespace
	if o.podFromEnv && podNamespace != "" && podNamespace != namespace {
		notes = append(notes, fmt.Sprintf("Not naming pod %s: it runs in namespace %s, not in %s where the claim is; the claim lives by renewal instead.",
			o.claim.PodName, podNamespace, namespace))
		o.claim.PodName, o.podFromEnv = "", false
	}
	if !o.expiresAfterSet && o.claim.PodName == "" && len(o.command) > 0 {
		o.claim.ExpiresAfter = defaultCommandExpiresAfter
	}
	return notes
}

// releaseOptions is a parsed `release` command line.
type releaseOptions struct {
	kube kubeFlags
	// name, or target with mine.
	name   string
	target string
	mine   bool
	// repo, branch and build identify "mine".
	repo, branch string
	build        int64
}

func parseRelease(args []string, env map[string]string) (releaseOptions, error) {
	var o releaseOptions
	fs := newFlagSet("release")
	o.kube.register(fs)
	fs.StringVar(&o.target, "target", "", "With --mine: the target whose claim of this build to release.")
	fs.BoolVar(&o.mine, "mine", false, "Release this build's claims on --target (the build as acquire finds it: flags, else CI variables).")
	fs.StringVar(&o.repo, "repo", "", "With --mine: the repository (default: from CI variables).")
	fs.StringVar(&o.branch, "branch", "", "With --mine: the branch (default: from CI variables).")
	fs.Int64Var(&o.build, "build", 0, "With --mine: the build number (default: from CI variables).")
	positional, command, dash, err := parseArgs(fs, args)
	if err != nil {
		return o, err
	}
	if dash || len(command) > 0 {
		return o, usagef("release runs no command")
	}
	switch {
	case len(positional) > 1:
		return o, usagef("release takes one BuildLock name, got %q", positional)
	case len(positional) == 1 && (o.target != "" || o.mine):
		return o, usagef("give either a BuildLock name or --target with --mine, not both")
	case len(positional) == 1:
		o.name = positional[0]
		return o, nil
	case o.target == "" || !o.mine:
		return o, usagef("give a BuildLock name, or --target T --mine for this build's claim (to end another build's hold, use force-release)")
	}
	ci := lock.DetectCI(env)
	if !isSet(fs, "repo") {
		o.repo = ci.Repo
	}
	if !isSet(fs, "branch") {
		o.branch = ci.Branch
	}
	if !isSet(fs, "build") {
		o.build = ci.Build
	}
	if o.repo == "" || o.branch == "" || o.build < 1 {
		return o, usagef("--mine needs this build's repo, branch and build: pass --repo, --branch and --build, or run in CI")
	}
	return o, nil
}

// statusOptions is a parsed `status` command line.
type statusOptions struct {
	kube          kubeFlags
	target        string
	allNamespaces bool
	output        string
}

func parseStatus(args []string) (statusOptions, error) {
	var o statusOptions
	fs := newFlagSet("status")
	o.kube.register(fs)
	fs.StringVar(&o.target, "target", "", "Show only this target.")
	fs.BoolVar(&o.allNamespaces, "all-namespaces", false, "Show the locks of every namespace.")
	fs.BoolVar(&o.allNamespaces, "A", false, "Short for --all-namespaces.")
	fs.StringVar(&o.output, "output", "table", "Output format: table, json or yaml.")
	fs.StringVar(&o.output, "o", "table", "Short for --output.")
	positional, _, dash, err := parseArgs(fs, args)
	if err != nil {
		return o, err
	}
	if len(positional) > 0 || dash {
		return o, usagef("status takes no arguments; use --target to pick a target")
	}
	switch o.output {
	case "table", "json", "yaml":
	default:
		return o, usagef("--output must be table, json or yaml, not %q", o.output)
	}
	return o, nil
}

// forceReleaseOptions is a parsed `force-release` command line.
type forceReleaseOptions struct {
	kube   kubeFlags
	target string
	reason string
}

func parseForceRelease(args []string) (forceReleaseOptions, error) {
	var o forceReleaseOptions
	fs := newFlagSet("force-release")
	o.kube.register(fs)
	fs.StringVar(&o.target, "target", "", "The target whose hold to end (required).")
	fs.StringVar(&o.reason, "reason", "", "Why, for the record (required).")
	positional, _, dash, err := parseArgs(fs, args)
	if err != nil {
		return o, err
	}
	if len(positional) > 0 || dash {
		return o, usagef("force-release takes no arguments; use --target")
	}
	o.reason = strings.TrimSpace(o.reason)
	switch {
	case o.target == "" && o.reason == "":
		return o, usagef("--target and --reason are required")
	case o.target == "":
		return o, usagef("--target is required")
	case o.reason == "":
		return o, usagef("--reason is required: say why the hold must end")
	}
	return o, nil
}
