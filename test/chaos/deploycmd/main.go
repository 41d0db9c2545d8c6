// Command deploycmd stands in for a deploy in the chaos test: the test runs
// it as CMD of `kubectl buildlock acquire -- CMD`, and it records from
// inside the process when it ran, so that the checker can tell whether two
// deployers ran at once on one target. It appends one line per stamp to the
// file -out, each written with a single write:
//
//	start <unix nanoseconds> <BUILDLOCK_NAME> <BUILDLOCK_FENCING_TOKEN>
//	beat <unix nanoseconds>        (every -beat while it runs)
//	term <unix nanoseconds>        (SIGTERM received)
//	end <unix nanoseconds>         (it exits by itself)
//
// It runs for -for, then exits 0. On SIGTERM it exits 143 at once, unless
// -ignore-term: then it goes on until SIGKILL, as a deploy that takes its
// time to stop would (the plugin's supervisor sends SIGKILL after the grace
// period). A process killed with SIGKILL writes nothing more: its last beat
// says when it was last seen running.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	out := flag.String("out", "", "the file to append the stamps to")
	run := flag.Duration("for", time.Second, "how long the deploy takes")
	beat := flag.Duration("beat", 20*time.Millisecond, "how often to stamp while running")
	ignoreTerm := flag.Bool("ignore-term", false, "go on after SIGTERM, until SIGKILL")
	flag.Parse()
	f, err := os.OpenFile(*out, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		fmt.Fprintf(os.Stderr, "deploycmd: %v\n", err)
		os.Exit(1)
	}
	stamp := func(kind string, extra ...any) {
		line := fmt.Sprint(append([]any{kind, " ", time.Now().UnixNano()}, extra...)...) + "\n"
		_, _ = f.WriteString(line)
	}
	terms := make(chan os.Signal, 1)
	signal.Notify(terms, syscall.SIGTERM)
	stamp("start", " ", os.Getenv("BUILDLOCK_NAME"), " ", os.Getenv("BUILDLOCK_FENCING_TOKEN"))
	done := time.After(*run)
	tick := time.NewTicker(*beat)
	defer tick.Stop()
	for {
		select {
		case <-done:
			stamp("end")
			os.Exit(0)
		case <-terms:
			stamp("term")
			if !*ignoreTerm {
				os.Exit(143)
			}
		case <-tick.C:
			stamp("beat")
		}
	}
}
