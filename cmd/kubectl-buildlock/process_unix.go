//go:build !windows

package main

// CMD runs under a supervisor: the plugin re-executed (superviseArg), a
// process between the plugin and CMD, outside the plugin's process group.
// It starts CMD as the leader of a process group of its own and stops that
// whole group (SIGTERM, then SIGKILL after the grace period) as soon as the
// plugin's end of a pipe closes, which the kernel does however the plugin
// ends: a SIGKILL of the plugin alone, or of its process group (a CI runner
// canceling a job), or a crash. PR_SET_PDEATHSIG alone would not do: it
// reaches CMD but not what CMD started (a deploy script's helm), and it
// fires when the thread that started CMD ends, not the process. A group of
// CMD's own stops everything CMD starts, except what leaves the group on
// purpose (setsid, a daemon): that is bounded by the claim's expiry.
//
// Through the same pipe the plugin asks the supervisor to signal CMD's
// group (one byte, the signal's number). When CMD exits, the supervisor
// kills what CMD left running in its group before it exits with CMD's exit
// code, so that nothing of CMD writes once the lock is released.

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"
	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// superviseArg, as the plugin's first argument, makes it CMD's supervisor:
// superviseArg GRACE GROUP -- CMD ARGS..., with the control pipe's read end
// as file descriptor 3 and the report pipe's write end as 4.
const superviseArg = "__supervise"

// command is CMD, running under its supervisor.
type command struct {
	sup *exec.Cmd
	// control is the plugin's end of the control pipe: one byte per signal
	// for CMD's group; when it closes, the supervisor stops CMD.
	control *os.File
	// group says CMD leads a process group of its own.
	group bool
	// pid is CMD's, as the supervisor reported it; 0 when CMD did not start.
	pid int
}

// startCommand starts name with args and env under a supervisor, with the
// streams of the plugin. CMD gets a process group of its own unless stdin
// is a terminal: there it must stay in the terminal's foreground group to
// read from it, and the terminal sends Ctrl-C to it and to the plugin
// alike.
func startCommand(name string, args, env []string, streams genericiooptions.IOStreams, grace time.Duration) (*command, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding the plugin's executable to supervise %s: %w", name, err)
	}
	controlR, controlW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("creating the supervisor's pipe: %w", err)
	}
	reportR, reportW, err := os.Pipe()
	if err != nil {
		_, _ = controlR.Close(), controlW.Close()
		return nil, fmt.Errorf("creating the supervisor's pipe: %w", err)
	}
	group := true
	if f, ok := streams.In.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		group = false
	}
	sup := exec.Command(self, append([]string{superviseArg, grace.String(), strconv.FormatBool(group), "--", name}, args...)...)
	sup.Stdin, sup.Stdout, sup.Stderr = streams.In, streams.Out, streams.ErrOut
	sup.Env = env
	sup.ExtraFiles = []*os.File{controlR, reportW}
	// Outside the plugin's process group, so that a signal to that group
	// (a runner canceling the job) leaves the supervisor to stop CMD.
	sup.SysProcAttr = &syscall.SysProcAttr{Setpgid: group}
	err = sup.Start()
	_, _ = controlR.Close(), reportW.Close()
	if err != nil {
		_, _ = controlW.Close(), reportR.Close()
		return nil, fmt.Errorf("starting the supervisor of %s: %w", name, err)
	}
	c := &command{sup: sup, control: controlW, group: group}
	// The supervisor reports CMD's pid once CMD runs, and closes the pipe
	// either way.
	line, _ := bufio.NewReader(reportR).ReadString('\n')
	_ = reportR.Close()
	c.pid, _ = strconv.Atoi(strings.TrimSpace(line))
	return c, nil
}

// signal asks the supervisor to send sig to CMD's process group (to CMD
// alone when it has no group of its own).
func (c *command) signal(sig os.Signal) {
	if s, ok := sig.(syscall.Signal); ok {
		_, _ = c.control.Write([]byte{byte(s)})
	}
}

// wait waits for the supervisor, and returns how it ended: CMD's exit code
// (128 plus the signal that ended CMD). A supervisor that was killed
// itself cannot stop CMD: wait kills CMD's group then.
func (c *command) wait() *os.ProcessState {
	_ = c.sup.Wait() // its result is in ProcessState
	_ = c.control.Close()
	if ws, ok := c.sup.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && c.pid > 0 {
		pid := c.pid
		if c.group {
			pid = -pid
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return c.sup.ProcessState
}

// supervise is the supervisor's main (see the top of this file); it
// returns CMD's exit code.
func supervise(args []string) int {
	if len(args) < 4 || args[2] != "--" {
		fmt.Fprintf(os.Stderr, "usage: kubectl-buildlock %s GRACE GROUP -- CMD [ARGS...] (started by acquire only)\n", superviseArg)
		return exitUsage
	}
	grace, err := time.ParseDuration(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "error: %s: %v\n", superviseArg, err)
		return exitUsage
	}
	group, name := args[1] == "true", args[3]
	control, report := os.NewFile(3, "control"), os.NewFile(4, "report")
	// CMD must not hold the pipes: the plugin's death closes them.
	syscall.CloseOnExec(3)
	syscall.CloseOnExec(4)
	// Signals sent to the supervisor (a terminal's Ctrl-C reaches its whole
	// foreground group) reach CMD on their own, or through the plugin. A
	// broken stderr (the plugin's reader gone) must not end the supervisor
	// before it stopped CMD. Caught, not ignored: CMD starts with the
	// default handlers.
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGPIPE)

	// PR_SET_PDEATHSIG (Linux) fires when the thread that started CMD ends:
	// this goroutine keeps its thread until the supervisor exits.
	runtime.LockOSThread()
	cmd := exec.Command(name, args[4:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: group}
	dieWithParent(cmd.SysProcAttr)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "error: starting %s: %v\n", name, err)
		_ = report.Close()
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return 127
		}
		return 126
	}
	fmt.Fprintf(report, "%d\n", cmd.Process.Pid)
	_ = report.Close()
	stop := func(sig syscall.Signal) {
		pid := cmd.Process.Pid
		if group {
			pid = -pid
		}
		_ = syscall.Kill(pid, sig)
	}

	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait() // its result is in cmd.ProcessState
		close(exited)
	}()
	requests := make(chan syscall.Signal)
	go func() {
		defer close(requests)
		b := make([]byte, 1)
		for {
			if n, err := control.Read(b); n == 1 {
				requests <- syscall.Signal(b[0])
			} else if err != nil {
				return // the plugin has ended, however it ended
			}
		}
	}()
	var kill <-chan time.Time
	for exited != nil {
		select {
		case <-exited:
			exited = nil
		case sig, ok := <-requests:
			if ok {
				stop(sig)
				continue
			}
			requests = nil
			fmt.Fprintf(os.Stderr, "kubectl-buildlock is gone: stopping %s (SIGTERM; SIGKILL after %s).\n", name, grace)
			stop(syscall.SIGTERM)
			kill = time.After(grace)
		case <-kill:
			stop(syscall.SIGKILL)
		case <-signals:
		}
	}
	if group {
		stop(syscall.SIGKILL) // what CMD left running in its group
	}
	return exitStatus(cmd.ProcessState)
}
