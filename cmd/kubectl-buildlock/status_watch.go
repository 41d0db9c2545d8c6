package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/buildlock/buildlock/pkg/lock"
)

// runWatch is `status --watch`: the locks as status shows them, then again
// after every change (lock.WatchStatus), until SIGINT or SIGTERM, which end
// it with exit code 0. In the table format each picture starts with the
// time it was seen.
func (o *statusOptions) runWatch(ctx context.Context, c client.WithWatch) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	table := o.printer == nil
	return lock.WatchStatus(ctx, c, o.namespace, o.target, func(locks []lock.Summary) error {
		if table {
			fmt.Fprintf(o.f.streams.Out, "\n%s\n", time.Now().Format(time.TimeOnly))
		}
		return o.show(locks)
	}, lock.WithErrorHandler(warnOnce(o.f.streams.ErrOut)))
}
