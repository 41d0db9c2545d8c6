// Command kubectl-buildlock is the kubectl plugin of buildlock (`kubectl
// buildlock` once on PATH): pipelines take turns deploying into a target.
// It is built like kubectl's own commands, on cobra and k8s.io/cli-runtime
// (kubectl's connection flags, -o with kubectl's printers, completion), and
// on pkg/lock for every operation on the API: it parses flags and prints.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"sync"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/buildlock/buildlock/pkg/lock"
)

// version is the plugin's release, set by release builds (-X main.version:
// GoReleaser and ko, from the tag); see currentVersion.
var version string

func main() {
	configureLogging(io.Discard) // -v, once parsed, may ask for more
	if len(os.Args) > 1 && os.Args[1] == superviseArg {
		os.Exit(supervise(os.Args[2:]))
	}
	streams := genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}
	os.Exit(run(context.Background(), os.Args[1:], streams, os.Environ()))
}

// run runs the plugin with args and returns its exit code.
func run(ctx context.Context, args []string, streams genericiooptions.IOStreams, environ []string) int {
	root := newRootCommand(newFactory(streams, environ))
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	return exitWith(cmd, err, streams.ErrOut)
}

const rootLong = `kubectl buildlock makes pipelines take turns deploying into a target: a build
claims it (a BuildLock in the pipeline's namespace), and the buildlock operator
grants it to one build at a time, in the order of the target's BuildLockPolicy.

` + exitCodesHelp

// exitCodesHelp is the contract for scripts.
const exitCodesHelp = `Exit codes:
  0         done; acquire: the lock is held (with -- CMD: CMD's exit code, after releasing)
  1         error (API server, permissions, no operator, no holder to force-release, ...)
  2         usage error (flags; a missing or invalid repo, branch or build; a bad --reason)
  3         superseded: this build must not deploy (a newer one goes instead, a higher one already
            deployed, another run of it holds, ...: the message says which); stop without deploying
  4         timed out waiting (--timeout); the claim was deleted
  5         the claim ended before it held, or stopped holding while CMD ran (CMD stopped)
  6         another run of this build, or another job with this run id, has a claim in the
            running; this run claimed nothing (--run-id gives each job its own)
  7         acquire --fail-if-frozen: the target is frozen; the claim was deleted
  126, 127  CMD could not be started (not executable, not found); the lock was released
  130, 143  interrupted by SIGINT or SIGTERM; the claim was deleted`

// newRootCommand is `kubectl buildlock` and its commands, with kubectl's
// connection flags on every one.
func newRootCommand(f *factory) *cobra.Command {
	root := &cobra.Command{
		Use:           "kubectl-buildlock",
		Short:         "Make pipelines take turns deploying into a target",
		Long:          rootLong,
		Version:       currentVersion().Version,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl buildlock"},
		SilenceErrors: true, SilenceUsage: true,
	}
	root.SetIn(f.streams.In)
	root.SetOut(f.streams.Out)
	root.SetErr(f.streams.ErrOut)
	f.kube.AddFlags(root.PersistentFlags())
	addVerbosityFlag(root.PersistentFlags())
	root.PersistentPreRun = func(*cobra.Command, []string) { configureLogging(f.streams.ErrOut) }
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageErr{err} })
	root.AddCommand(
		newAcquireCommand(&acquireOptions{f: f}),
		newReleaseCommand(&releaseOptions{f: f}),
		newStatusCommand(&statusOptions{f: f}),
		newForceReleaseCommand(&forceReleaseOptions{f: f}),
		newFreezeCommand(&freezeOptions{f: f}),
		newUnfreezeCommand(&unfreezeOptions{f: f}),
		newOverrideCommand(&overrideOptions{f: f}),
		newVersionCommand(&versionOptions{f: f}),
		newOIDCTokenCommand(&oidcTokenOptions{f: f}),
		newOIDCKubeconfigCommand(&oidcKubeconfigOptions{f: f}),
		newBuildNumberCommand(&buildNumberOptions{f: f}),
	)
	return root
}

// addVerbosityFlag adds kubectl's -v (--v): klog's verbosity, which
// client-go's logs follow. It starts at 0 on every run (klog's level is
// global, and tests run the plugin many times in one process).
func addVerbosityFlag(fs *pflag.FlagSet) {
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	v := klogFlags.Lookup("v")
	_ = v.Value.Set("0")
	v.Usage = "Number for the log level verbosity, as kubectl's: 6 logs each API request (method, URL, status, time), 7 their headers, 8 and more the bodies."
	fs.AddGoFlag(v) // a one-letter Go flag becomes -v and --v
}

// configureLogging sends client-go's logs (klog) to stderr when -v asks
// for them, and nowhere otherwise: at 0 the plugin reports what matters
// itself, and client-go's logs (a watch that is retried) would only repeat
// it. From -v=6 on, client-go's round trippers log every request, as
// kubectl's do.
func configureLogging(stderr io.Writer) {
	klog.LogToStderr(false)
	if !klog.V(1).Enabled() {
		klog.SetOutput(io.Discard)
		logf.SetLogger(logr.Discard())
		return
	}
	klog.SetOutput(stderr)
	logf.SetLogger(klog.NewKlogr())
}

// options is the shape of every command, kubernetes/sample-cli-plugin's:
// Complete fills the options from flags, arguments and the environment,
// Validate checks them, Run does the work through pkg/lock and prints.
type options interface {
	Complete(cmd *cobra.Command, args []string) error
	Validate() error
	Run(ctx context.Context) error
}

// prepare runs o's Complete and Validate; Validate's errors are usage
// errors.
func prepare(o options, cmd *cobra.Command, args []string) error {
	if err := o.Complete(cmd, args); err != nil {
		return err
	}
	if err := o.Validate(); err != nil {
		return usageErr{err}
	}
	return nil
}

// newCommand is a command that runs o: prepare, then Run. Its errors are
// marked as the command's, so that exitWith tells them from cobra's.
func newCommand(o options, use, short, long, example string) *cobra.Command {
	return &cobra.Command{Use: use, Short: short, Long: long, Example: example, RunE: func(cmd *cobra.Command, args []string) error {
		err := prepare(o, cmd, args)
		if err == nil {
			err = o.Run(cmd.Context())
		}
		if err != nil {
			return commandErr{err}
		}
		return nil
	}}
}

// factory is what the commands share: kubectl's connection flags, the
// streams, and the environment (env, for CI variables; environ, for CMD).
type factory struct {
	kube    *genericclioptions.ConfigFlags
	streams genericiooptions.IOStreams
	env     map[string]string
	environ []string
}

func newFactory(streams genericiooptions.IOStreams, environ []string) *factory {
	env := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v // the last value of a key wins, as in getenv
		}
	}
	return &factory{kube: genericclioptions.NewConfigFlags(false), streams: streams, env: env, environ: environ}
}

// namespace is where the commands work, as kubectl finds it: -n, else the
// kubeconfig context's, else the pod's own (in a cluster), else default.
func (f *factory) namespace() (string, error) {
	ns, _, err := f.kube.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return "", fmt.Errorf("finding the namespace: %w", err)
	}
	return ns, nil
}

// localRunID is the run id of a build acquired by hand (no CI variables):
// this user on this machine (lock.LocalRunID).
func (f *factory) localRunID() string {
	name := cmp.Or(f.env["USER"], f.env["LOGNAME"], f.env["USERNAME"])
	if name == "" {
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
	}
	host, _ := os.Hostname()
	return lock.LocalRunID(name, host)
}

// client connects as kubectl would with the same flags.
func (f *factory) client() (client.WithWatch, error) {
	cfg, err := f.kube.ToRESTConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the kubeconfig: %w", err)
	}
	cfg.UserAgent = "kubectl-buildlock"
	return lock.NewClient(cfg)
}

// warnOnce returns a pkg/lock error handler that prints each distinct
// warning once; it is safe for concurrent use (renewals report from their
// own goroutine).
func warnOnce(out io.Writer) func(error) {
	var seen sync.Map
	return func(err error) {
		if _, dup := seen.LoadOrStore(err.Error(), true); !dup {
			fmt.Fprintf(out, "warning: %v\n", err)
		}
	}
}

// The plugin's exit codes, as exitCodesHelp documents them.
const (
	exitOK, exitError, exitUsage, exitSuperseded, exitTimeout, exitEnded, exitOtherRun = 0, 1, 2, 3, 4, 5, 6
	exitFrozen                                                                         = 7
)

// usageErr marks an error as the user's command line being wrong.
type usageErr struct{ err error }

func (e usageErr) Error() string { return e.err.Error() }
func (e usageErr) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageErr{fmt.Errorf(format, args...)}
}

// commandErr marks an error as a command's own (from its Complete, Validate
// or Run), as opposed to cobra refusing the command line.
type commandErr struct{ err error }

func (e commandErr) Error() string { return e.err.Error() }
func (e commandErr) Unwrap() error { return e.err }

// codeErr is an exit code whose reason has been told already (acquire's
// outcomes), or that is a command's own.
type codeErr int

func (e codeErr) Error() string { return fmt.Sprintf("exit code %d", int(e)) }

// exitCode maps an outcome to the plugin's exit code.
func exitCode(err error) int {
	var code codeErr
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &code):
		return int(code)
	case errors.Is(err, lock.ErrSuperseded):
		return exitSuperseded
	case errors.Is(err, lock.ErrTimeout):
		return exitTimeout
	case errors.Is(err, lock.ErrEnded), errors.Is(err, lock.ErrLost):
		return exitEnded
	case errors.Is(err, lock.ErrClaimedByAnotherRun):
		return exitOtherRun
	case errors.Is(err, lock.ErrFrozen):
		return exitFrozen
	case errors.As(err, new(usageErr)), errors.Is(err, lock.ErrInvalidClaim), errors.Is(err, lock.ErrInvalidReason):
		return exitUsage
	}
	return exitError
}

// exitWith reports the error of cmd (the command cobra ran, or failed to
// find) and returns the exit code. Errors that are not a command's own are
// cobra's: an unknown command or flag, a usage error.
func exitWith(cmd *cobra.Command, err error, stderr io.Writer) int {
	if err == nil {
		return exitOK
	}
	if !errors.As(err, new(commandErr)) {
		err = usageErr{err}
	}
	code := exitCode(err)
	if !errors.As(err, new(codeErr)) {
		fmt.Fprintf(stderr, "error: %v\n", explain(err))
	}
	if code == exitUsage {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
	}
	return code
}

// signalExitCode is the shell's code for a process ended by sig: 128 plus
// the signal's number (130 for SIGINT, 143 for SIGTERM).
func signalExitCode(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return exitError
}

// explain adds a hint to errors whose cause is usually the setup.
func explain(err error) error {
	if meta.IsNoMatchError(err) {
		return fmt.Errorf("%w (is the BuildLock CRD installed in this cluster?)", err)
	}
	return err
}
