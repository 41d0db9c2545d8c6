package main

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/buildlock/buildlock/pkg/lock"
)

// The plugin's exit codes. With `acquire -- CMD`, a held lock exits with
// CMD's code instead of exitOK.
const (
	// exitOK: the lock is held (acquire), or the command did what was asked.
	exitOK = 0
	// exitError: something went wrong (API errors, RBAC, no operator...).
	exitError = 1
	// exitUsage: the command line is wrong.
	exitUsage = 2
	// exitSuperseded: a newer build will deploy; this one must stop without
	// deploying. A neutral outcome, not a failure.
	exitSuperseded = 3
	// exitTimeout: --timeout passed while waiting; the claim was deleted.
	exitTimeout = 4
	// exitEnded: the claim ended (Released, Expired or deleted) before it
	// held the lock.
	exitEnded = 5
)

// usageErr marks an error as the user's command line being wrong.
type usageErr struct{ err error }

func (e usageErr) Error() string { return e.err.Error() }
func (e usageErr) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageErr{fmt.Errorf(format, args...)}
}

// exitCode maps an outcome to the plugin's exit code.
func exitCode(err error) int {
	var usage usageErr
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, lock.ErrSuperseded):
		return exitSuperseded
	case errors.Is(err, lock.ErrTimeout):
		return exitTimeout
	case errors.Is(err, lock.ErrEnded):
		return exitEnded
	case errors.As(err, &usage), errors.Is(err, lock.ErrInvalidClaim):
		return exitUsage
	}
	return exitError
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
