//go:build windows

package main

import (
	"io"
	"os"
	"os/exec"
)

// startOwnGroup does nothing on Windows: there are no process groups to
// signal.
func startOwnGroup(*exec.Cmd, io.Reader) bool { return false }

// signalCommand ends the command: Windows delivers no signal but Kill to
// another process, so every signal ends it at once.
func signalCommand(cmd *exec.Cmd, _ bool, _ os.Signal) {
	_ = cmd.Process.Kill()
}
