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
// passing it the arguments after "--". Either way the operator serves its
// metrics over plain HTTP on -metrics-bind-address (127.0.0.1:8080, or a
// free port when that is taken), and the welcome says where.
//
// Ctrl-C stops the operator and the control plane and removes their files,
// also when the output is piped (`make run 2>&1 | tee log`: the terminal's
// SIGINT reaches tee too, and writing to it then fails): SIGINT, SIGTERM,
// SIGHUP (the terminal closed) and SIGPIPE (nobody reads the output) all
// stop it cleanly. Should it die anyway (SIGKILL), etcd and kube-apiserver
// die with it on Linux (PR_SET_PDEATHSIG); a second signal exits at once.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/buildlock/buildlock/internal/controller"
	"github.com/buildlock/buildlock/internal/localcluster"
	"github.com/buildlock/buildlock/internal/testenv"
)

func main() {
	localcluster.RunChildIfAsked()
	manager := flag.String("manager", "", "Run this manager binary (e.g. bin/manager) against the local control plane instead of the operator in-process; arguments after -- are passed to it.")
	opts := testenv.DefaultManagerOptions()
	flag.DurationVar(&opts.FinishedTTL, "finished-ttl", opts.FinishedTTL, "Delete finished claims after this long (in-process operator only; 0 keeps them).")
	opts.MetricsBindAddress = controller.LocalMetricsBindAddress
	flag.StringVar(&opts.MetricsBindAddress, "metrics-bind-address", opts.MetricsBindAddress, "Serve the operator's metrics over plain HTTP here; a free port of the same host when it is taken, \"0\" for none.")
	zapOpts := zap.Options{Development: true}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: %s [flags] [-- manager flags]\n\n", filepath.Base(os.Args[0]))
		flag.PrintDefaults()
	}
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))

	// The first signal stops everything cleanly; a second one exits at
	// once. SIGPIPE is caught like the others, so that a write to a reader
	// that is gone fails instead of killing this process mid-cleanup.
	ctx, stop := signal.NotifyContext(context.Background(), stopSignals...)
	go func() {
		<-ctx.Done()
		stop()
		signal.Ignore(syscall.SIGPIPE)
	}()

	if err := run(ctx, os.Stdout, *manager, flag.Args(), opts); err != nil {
		fmt.Fprintln(os.Stderr, "localcluster:", err)
		os.Exit(1)
	}
}

// stopSignals stop `make run` cleanly.
var stopSignals = []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE}

func run(ctx context.Context, out io.Writer, manager string, managerArgs []string, opts testenv.ManagerOptions) (err error) {
	log := ctrl.Log.WithName("localcluster")
	log.Info("Starting a local control plane (etcd and kube-apiserver)")
	c, err := localcluster.Start(localcluster.Options{DieWithThisProcess: true})
	if err != nil {
		return err
	}
	defer func() {
		log.Info("Stopping the local control plane and removing its files", "dir", c.Dir)
		err = errors.Join(err, c.Stop())
	}()

	metrics, err := metricsAddress(opts.MetricsBindAddress)
	if err != nil {
		return err
	}
	printWelcome(out, c, metrics)

	if manager != "" {
		return runBinary(ctx, c, manager, append(metricsFlags(metrics), managerArgs...))
	}
	// The one manager of this process: controller-runtime's registry, the
	// one its metrics server serves, gets the operator's metrics.
	opts.MetricsBindAddress, opts.SecureMetrics, opts.Registry = metrics, false, ctrlmetrics.Registry
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

// metricsAddress is where the operator serves its metrics: addr, or a free
// port of addr's host when addr is taken; "" when addr is "" or "0".
func metricsAddress(addr string) (string, error) {
	if addr == "" || addr == "0" {
		return "", nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		host, _, splitErr := net.SplitHostPort(addr)
		if splitErr != nil {
			return "", fmt.Errorf("-metrics-bind-address %q: %w", addr, splitErr)
		}
		if l, err = net.Listen("tcp", net.JoinHostPort(host, "0")); err != nil {
			return "", fmt.Errorf("finding a port for the metrics: %w", err)
		}
	}
	free := l.Addr().String()
	return free, l.Close()
}

// metricsFlags are a manager binary's flags to serve its metrics at addr
// over plain HTTP (none when addr is ""), before the user's own.
func metricsFlags(addr string) []string {
	if addr == "" {
		return []string{"--metrics-bind-address=0"}
	}
	return []string{"--metrics-bind-address=" + addr, "--metrics-secure=false"}
}

func printWelcome(out io.Writer, c *localcluster.Cluster, metrics string) {
	kubectl := localcluster.KubectlPath(c.Root)
	served := "The operator serves no metrics (-metrics-bind-address 0)."
	if metrics != "" {
		served = fmt.Sprintf("The operator's metrics: curl http://%s/metrics", metrics)
	}
	fmt.Fprintf(out, `
A local control plane is running with the BuildLock CRD, and the operator is
watching it. In another terminal:

export KUBECONFIG=%s

  kubectl apply -f config/samples/
  kubectl get buildlocks -w

No kubectl? Use %s.
There is no kubelet: finish a pipeline pod by setting its phase, e.g.
  kubectl patch pod shop-main-41 --subresource=status --type=merge -p '{"status":{"phase":"Succeeded"}}'

%s

Ctrl-C stops the operator and the control plane and removes their files.

`, c.Kubeconfig, kubectl, served)
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
	cmd.SysProcAttr = childProcAttr()
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
