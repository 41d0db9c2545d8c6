package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"syscall"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/buildlock/buildlock/pkg/lock"
)

func TestExitCode(t *testing.T) {
	tests := map[string]struct {
		err  error
		want int
	}{
		"held":                               {err: nil, want: 0},
		"superseded is its own code":         {err: &lock.SupersededError{Name: "a"}, want: 3},
		"a wrapped superseded":               {err: fmt.Errorf("x: %w", &lock.SupersededError{}), want: 3},
		"timeout":                            {err: &lock.TimeoutError{Name: "a"}, want: 4},
		"released before holding":            {err: &lock.EndedError{Reason: "PodFinished"}, want: 5},
		"deleted while waiting":              {err: &lock.EndedError{Reason: lock.ReasonDeleted}, want: 5},
		"a bad flag":                         {err: usagef("bad"), want: 2},
		"an invalid claim":                   {err: fmt.Errorf("%w: repo", lock.ErrInvalidClaim), want: 2},
		"forbidden by RBAC":                  {err: apierrors.NewForbidden(schema.GroupResource{Group: "buildlock.io", Resource: "buildlocks"}, "x", errors.New("no")), want: 1},
		"a canceled wait is an error":        {err: context.Canceled, want: 1},
		"a name taken":                       {err: lock.ErrNameTaken, want: 1},
		"another run's claim":                {err: &lock.ClaimedByAnotherRunError{}, want: 6},
		"a frozen target (--fail-if-frozen)": {err: &lock.FrozenError{Name: "a"}, want: 7},
		"a hold lost while CMD ran":          {err: fmt.Errorf("x: %w", &lock.LostError{Reason: lock.ReasonDeleted}), want: 5},
		"a bad force-release reason":         {err: fmt.Errorf("--reason: %w", lock.ErrInvalidReason), want: 2},
		"no holder to force-release":         {err: lock.ErrNoHolder, want: 1},
		"an exit code told already":          {err: commandErr{codeErr(143)}, want: 143},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := exitCode(tc.err); got != tc.want {
				t.Errorf("exitCode(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}

func TestSignalAndProcessExitCodes(t *testing.T) {
	if got := signalExitCode(syscall.SIGINT); got != 130 {
		t.Errorf("SIGINT: %d, want 130", got)
	}
	if got := signalExitCode(syscall.SIGTERM); got != 143 {
		t.Errorf("SIGTERM: %d, want 143", got)
	}
	for script, want := range map[string]int{"exit 0": 0, "exit 7": 7, "kill -TERM $$": 143, "kill -KILL $$": 137} {
		cmd := exec.Command("sh", "-c", script)
		_ = cmd.Run()
		if got := exitStatus(cmd.ProcessState); got != want {
			t.Errorf("%q: exit status %d, want %d", script, got, want)
		}
	}
}
