// Command localcluster is `make run` on a machine without a cluster: it starts
// a throwaway control plane (the etcd and kube-apiserver the tests use) with
// the BuildLock CRD, prints the line that points kubectl at it, and runs the
// operator against it until Ctrl-C, which stops everything and removes the
// temporary files.
//
// There is no kubelet, scheduler or controller-manager: pods stay where you
// put them, so end a pipeline pod by setting its phase, for example
//
//	kubectl patch pod my-pod --subresource=status --type=merge -p '{"status":{"phase":"Succeeded"}}'
//
// By default the operator runs in this process; with -manager it runs the
// given manager binary (for example bin/manager from `make build`) instead,
// passing it the arguments after "--".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/buildlock/buildlock/internal/localcluster"
	"github.com/buildlock/buildlock/internal/testenv"
)

func main() {
	manager := flag.String("manager", "", "Run this manager binary (e.g. bin/manager) against the local control plane instead of the operator in-process; arguments after -- are passed to it.")
	opts := testenv.DefaultManagerOptions()
	flag.DurationVar(&opts.FinishedTTL, "finished-ttl", opts.FinishedTTL, "Delete finished claims after this long (in-process operator only; 0 keeps them).")
	zapOpts := zap.Options{Development: true}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: %s [flags] [-- manager flags]\n\n", filepath.Base(os.Args[0]))
		flag.PrintDefaults()
	}
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))

	// The first Ctrl-C stops everything cleanly; a second one exits at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()

	if err := run(ctx, os.Stdout, *manager, flag.Args(), opts); err != nil {
		fmt.Fprintln(os.Stderr, "localcluster:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer, manager string, managerArgs []string, opts testenv.ManagerOptions) (err error) {
	log := ctrl.Log.WithName("localcluster")
	log.Info("Starting a local control plane (etcd and kube-apiserver)")
	c, err := localcluster.Start(localcluster.Options{})
	if err != nil {
		return err
	}
	defer func() {
		log.Info("Stopping the local control plane and removing its files", "dir", c.Dir)
		err = errors.Join(err, c.Stop())
	}()

	printWelcome(out, c)

	if manager != "" {
		return runBinary(ctx, c, manager, managerArgs)
	}
	m, err := testenv.StartManager(ctx, c.Config, opts)
	if err != nil {
		return err
	}
	log.Info("Operator running in-process; press Ctrl-C to stop")
	<-ctx.Done()
	log.Info("Stopping the operator")
	if err := m.Stop(); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("stopping the operator: %w", err)
	}
	return nil
}

func printWelcome(out io.Writer, c *localcluster.Cluster) {
	kubectl := localcluster.KubectlPath(c.Root)
	fmt.Fprintf(out, `
A local control plane is running with the BuildLock CRD, and the operator is
watching it. In another terminal:

export KUBECONFIG=%s

  kubectl apply -f config/samples/
  kubectl get buildlocks -w

No kubectl? Use %s.
There is no kubelet: finish a pipeline pod by setting its phase, e.g.
  kubectl patch pod shop-main-41 --subresource=status --type=merge -p '{"status":{"phase":"Succeeded"}}'

Ctrl-C stops the operator and the control plane and removes their files.

`, c.Kubeconfig, kubectl)
}

// runBinary runs a manager binary against the local control plane until ctx
// ends, then stops it with SIGTERM (as the kubelet would).
func runBinary(ctx context.Context, c *localcluster.Cluster, manager string, args []string) error {
	// Out of a cluster the manager cannot find its own namespace, and the
	// default ports may be taken; explicit flags given after -- win, as the
	// last occurrence of a flag does.
	args = append([]string{"--leader-election-namespace=default"}, args...)
	cmd := exec.Command(manager, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	// Its own process group, so that the terminal's Ctrl-C reaches only us
	// and we stop it in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", manager, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return fmt.Errorf("%s exited: %w", manager, err)
	case <-ctx.Done():
	}
	ctrl.Log.WithName("localcluster").Info("Stopping the manager", "pid", cmd.Process.Pid)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("%s exited after SIGTERM: %w", manager, err)
		}
		return nil
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		return fmt.Errorf("%s did not stop within 30s of SIGTERM and was killed: %w", manager, <-done)
	}
}
