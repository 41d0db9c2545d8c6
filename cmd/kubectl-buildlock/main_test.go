package main

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// helperEnv makes the test binary act as the command that acquire runs
// (see helperMain).
const helperEnv = "BUILDLOCK_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	code := m.Run()
	if err := teardown(); err != nil {
		fmt.Fprintf(os.Stderr, "stopping the test cluster: %v\n", err)
	}
	os.Exit(code)
}

// helperMain writes its pid to $HELPER_DIR/$HELPER_ID.pid and
// $HELPER_ID.start with the start time and the lock's environment, sleeps
// $HELPER_SLEEP, writes .end and exits with $HELPER_EXIT. With
// HELPER_IGNORE_TERM it ignores SIGTERM; with HELPER_CHILD it first starts
// a child (`sleep`) and writes its pid to .child, to see whether a signal
// reaches the command's whole process group; with HELPER_ESCAPE it starts
// one in a session of its own (setsid, as a daemon does) and writes its pid
// to .escaped.
func helperMain() int {
	// write makes the file appear whole (a rename), so that a test that
	// polls for it never reads it empty.
	write := func(suffix, content string) {
		path := filepath.Join(os.Getenv("HELPER_DIR"), os.Getenv("HELPER_ID")+suffix)
		if err := os.WriteFile(path+".tmp", []byte(content), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(99)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(99)
		}
	}
	if os.Getenv("HELPER_IGNORE_TERM") != "" {
		signal.Ignore(syscall.SIGTERM)
	}
	write(".pid", strconv.Itoa(os.Getpid()))
	for _, child := range []struct {
		env, suffix string
		attr        *syscall.SysProcAttr
	}{{"HELPER_CHILD", ".child", nil}, {"HELPER_ESCAPE", ".escaped", &syscall.SysProcAttr{Setsid: true}}} {
		if os.Getenv(child.env) == "" {
			continue
		}
		cmd := exec.Command("sleep", "300")
		cmd.SysProcAttr = child.attr
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 98
		}
		write(child.suffix, strconv.Itoa(cmd.Process.Pid))
	}
	write(".start", fmt.Sprintf("%d %s %s", time.Now().UnixNano(), os.Getenv("BUILDLOCK_FENCING_TOKEN"), os.Getenv("BUILDLOCK_NAME")))
	if d, err := time.ParseDuration(os.Getenv("HELPER_SLEEP")); err == nil {
		time.Sleep(d)
	}
	write(".end", strconv.FormatInt(time.Now().UnixNano(), 10))
	code, _ := strconv.Atoi(os.Getenv("HELPER_EXIT"))
	return code
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
