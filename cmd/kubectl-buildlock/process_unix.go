//go:build !windows

package main

import (
	"io"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/term"
)

// startOwnGroup makes cmd the leader of a process group of its own, so that
// a signal reaches everything it started (a deploy script's kubectl, helm,
// ...), and says whether it did. It does not when stdin is a terminal:
// there the command must stay in the terminal's foreground group to read
// from it, and the terminal sends Ctrl-C to it and to the plugin alike.
func startOwnGroup(cmd *exec.Cmd, stdin io.Reader) bool {
	if f, ok := stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		return false
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return true
}

// signalCommand sends sig to the command's process group (its process alone
// when it has no group of its own).
func signalCommand(cmd *exec.Cmd, group bool, sig os.Signal) {
	s, ok := sig.(syscall.Signal)
	if !ok {
		_ = cmd.Process.Signal(sig)
		return
	}
	pid := cmd.Process.Pid
	if group {
		pid = -pid
	}
	_ = syscall.Kill(pid, s)
}
