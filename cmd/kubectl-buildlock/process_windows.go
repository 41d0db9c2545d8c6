//go:build windows

package main

// CMD runs in a job object of the plugin's that the system closes when the
// plugin ends, however it ends (a runner's TerminateProcess, a crash):
// with JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE, closing the job's last handle
// (the plugin's own, which nothing inherits) terminates every process in
// the job, CMD and whatever CMD started (children join their parent's job).
// So CMD dies with the plugin here as under the supervisor elsewhere; what
// leaves the job on purpose (a process created with breakaway where the
// job allows it, which this one does not) is bounded by the claim's expiry.
// The plugin joins the job itself before it starts CMD, so that CMD is in
// it from its first instruction; where the plugin cannot (an outer job that
// forbids nesting), CMD is assigned to the job right after it starts.

import (
	"fmt"
	"os"
	"os/exec"
	"time"
	"unsafe"

	"golang.org/x/sys/windows"
	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// superviseArg is not used on Windows: the job object does the
// supervisor's work.
const superviseArg = "__supervise"

// command is CMD, in the plugin's job.
type command struct{ cmd *exec.Cmd }

// killOnCloseJob returns a job object whose processes the system
// terminates when its last handle closes.
func killOnCloseJob() (windows.Handle, error) {
	job, err := windows.CreateJobObject(nil, nil)
	if err != nil {
		return 0, fmt.Errorf("creating a job object: %w", err)
	}
	info := windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION{
		BasicLimitInformation: windows.JOBOBJECT_BASIC_LIMIT_INFORMATION{LimitFlags: windows.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE},
	}
	if _, err := windows.SetInformationJobObject(job, windows.JobObjectExtendedLimitInformation,
		uintptr(unsafe.Pointer(&info)), uint32(unsafe.Sizeof(info))); err != nil {
		_ = windows.CloseHandle(job)
		return 0, fmt.Errorf("making the job kill its processes when it closes: %w", err)
	}
	return job, nil
}

// startCommand starts name with args and env, with the plugin's streams,
// in a job that ends with the plugin. CMD is not started when neither the
// plugin nor CMD can join it: a CMD that could outlive the plugin would
// deploy without the lock.
func startCommand(name string, args, env []string, streams genericiooptions.IOStreams, _ time.Duration) (*command, error) {
	job, err := killOnCloseJob()
	if err != nil {
		return nil, err
	}
	// The handle stays open for the plugin's life, on purpose: the system
	// closes it when the plugin ends, and that ends the job.
	joined := windows.AssignProcessToJobObject(job, windows.CurrentProcess()) == nil
	cmd := exec.Command(name, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = streams.In, streams.Out, streams.ErrOut
	cmd.Env = env
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	if !joined {
		if err := assign(job, cmd.Process.Pid); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, fmt.Errorf("putting the command in a job that ends with the plugin: %w", err)
		}
	}
	return &command{cmd: cmd}, nil
}

// assign puts process pid in job.
func assign(job windows.Handle, pid int) error {
	p, err := windows.OpenProcess(windows.PROCESS_SET_QUOTA|windows.PROCESS_TERMINATE, false, uint32(pid))
	if err != nil {
		return err
	}
	defer func() { _ = windows.CloseHandle(p) }()
	return windows.AssignProcessToJobObject(job, p)
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
