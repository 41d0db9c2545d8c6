// Command demo is `make demo`: on a throwaway local control plane with the
// operator running, three builds of two repositories contend for one deploy
// target, step by step, narrated, with `kubectl get buildlocks -o wide` after
// each step. Every step asserts the state it expects; the demo exits non-zero
// with the differences when a step's state is not observed within -timeout.
// demo_test.go plays the same scenario under `go test`.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

func main() {
	timeout := flag.Duration("timeout", 20*time.Second, "How long each step may take to reach its expected state.")
	verbose := flag.Bool("v", false, "Show the operator's logs.")
	flag.Parse()
	logs := io.Discard
	if *verbose {
		logs = os.Stderr
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(logs), zap.UseDevMode(true)))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, *timeout); err != nil {
		fmt.Fprintf(os.Stderr, "\nDemo FAILED: %v\n", err)
		os.Exit(1)
	}
}
