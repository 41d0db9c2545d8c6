//go:build windows

package main

import (
	"os"
	"os/exec"
	"time"

	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// superviseArg is not used on Windows: CMD runs as the plugin's child,
// without a supervisor. A plugin killed there leaves CMD running; the
// claim's expiry bounds how long the lock stays held for it.
const superviseArg = "__supervise"

// command is CMD.
type command struct{ cmd *exec.Cmd }

// startCommand starts name with args and env, with the plugin's streams.
func startCommand(name string, args, env []string, streams genericiooptions.IOStreams, _ time.Duration) (*command, error) {
	cmd := exec.Command(name, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = streams.In, streams.Out, streams.ErrOut
	cmd.Env = env
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &command{cmd: cmd}, nil
}

// signal ends the command: Windows delivers no signal but Kill to another
// process, so every signal ends it at once.
func (c *command) signal(os.Signal) { _ = c.cmd.Process.Kill() }

// wait waits for CMD and returns how it ended.
func (c *command) wait() *os.ProcessState {
	_ = c.cmd.Wait() // its result is in ProcessState
	return c.cmd.ProcessState
}

// supervise is never run on Windows.
func supervise([]string) int { return exitUsage }
