// Command kubectl-buildlock is the kubectl plugin of buildlock: pipelines
// take turns deploying into a target by claiming it (a BuildLock), waiting
// for the operator to grant it, and releasing it when they are done.
//
//	kubectl buildlock acquire --target staging -- ./deploy.sh
//
// Installed on PATH as kubectl-buildlock, kubectl runs it as `kubectl
// buildlock`. Run `kubectl buildlock --help` for the commands, their exit
// codes and examples.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

func main() {
	// controller-runtime's client logs through logr; the plugin reports
	// everything itself.
	logf.SetLogger(logr.Discard())
	a := &app{
		stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr,
		environ: os.Environ(),
		connect: connect,
	}
	os.Exit(a.run(context.Background(), os.Args[1:]))
}

// app is one run of the plugin, with its streams and environment injected so
// that tests can run it in-process.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	// environ is the process environment (KEY=value), from which CI
	// variables are read and which a command inherits.
	environ []string
	// connect returns an API client and the namespace to use.
	connect func(kubeFlags) (*kubeClient, error)
}

// env returns environ as a map; the last value of a key wins, as in getenv.
func (a *app) env() map[string]string {
	m := make(map[string]string, len(a.environ))
	for _, kv := range a.environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

func (a *app) run(ctx context.Context, args []string) int {
	args = hoistKubeFlags(args)
	if len(args) == 0 {
		fmt.Fprint(a.stderr, usage)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "-h", "-help", "--help":
		fmt.Fprint(a.stdout, usage)
		return exitOK
	case "help":
		if len(rest) == 0 {
			fmt.Fprint(a.stdout, usage)
			return exitOK
		}
		if help, ok := commandHelp[rest[0]]; ok {
			fmt.Fprint(a.stdout, help)
			return exitOK
		}
		return a.usageError("", fmt.Errorf("unknown command %q", rest[0]))
	case "acquire":
		return a.acquire(ctx, rest)
	case "release":
		return a.release(ctx, rest)
	case "status":
		return a.status(ctx, rest)
	case "force-release":
		return a.forceRelease(ctx, rest)
	}
	return a.usageError("", fmt.Errorf("unknown command %q", cmd))
}

// usageError reports a usage error of command ("" for the plugin itself) and
// returns the usage exit code.
func (a *app) usageError(command string, err error) int {
	fmt.Fprintf(a.stderr, "error: %v\n", err)
	if command == "" {
		fmt.Fprintln(a.stderr, "Run 'kubectl buildlock --help' for usage.")
	} else {
		fmt.Fprintf(a.stderr, "Run 'kubectl buildlock %s --help' for usage.\n", command)
	}
	return exitUsage
}

// fail reports err and returns its exit code.
func (a *app) fail(err error) int {
	fmt.Fprintf(a.stderr, "error: %v\n", explain(err))
	return exitCode(err)
}

// hoistKubeFlags moves the flags every command takes (--kubeconfig,
// --context, -n/--namespace) from before the command to just after it, so
// that `kubectl buildlock -n ci status` works as `status -n ci` does. Other
// arguments are left as they are.
func hoistKubeFlags(args []string) []string {
	var kube []string
	i := 0
	for i < len(args) {
		name, _, hasValue := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if !strings.HasPrefix(args[i], "-") || args[i] == "--" {
			break
		}
		switch name {
		case "n", "namespace", "kubeconfig", "context":
		default:
			return args
		}
		if hasValue || i+1 == len(args) {
			kube = append(kube, args[i])
			i++
			continue
		}
		kube = append(kube, args[i], args[i+1])
		i += 2
	}
	if i == 0 || i == len(args) {
		return args
	}
	return slices.Concat(args[i:i+1], kube, args[i+1:])
}
