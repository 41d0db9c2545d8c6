package localcluster

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// realBinariesEnv names the directory of the real etcd and kube-apiserver
// for a process started as one of them through this program's executable
// (see Options.DieWithThisProcess and RunChildIfAsked).
const realBinariesEnv = "BUILDLOCK_LOCALCLUSTER_BINARIES"

// controlPlaneBinaries are the programs envtest starts.
var controlPlaneBinaries = []string{"etcd", "kube-apiserver"}

// RunChildIfAsked is the first thing a main that starts a cluster with
// Options.DieWithThisProcess calls: when this process was started as etcd
// or kube-apiserver, it arranges to die with its parent and becomes the
// real program (it does not return); otherwise it returns at once.
func RunChildIfAsked() {
	dir := os.Getenv(realBinariesEnv)
	name := filepath.Base(os.Args[0])
	if dir == "" || !isControlPlaneBinary(name) {
		return
	}
	program := filepath.Join(dir, name)
	if err := dieWithParent(); err != nil {
		fmt.Fprintf(os.Stderr, "localcluster: %s: %v\n", name, err)
		os.Exit(1)
	}
	err := syscall.Exec(program, append([]string{program}, os.Args[1:]...), os.Environ())
	fmt.Fprintf(os.Stderr, "localcluster: starting %s: %v\n", program, err)
	os.Exit(1)
}

func isControlPlaneBinary(name string) bool {
	for _, b := range controlPlaneBinaries {
		if b == name {
			return true
		}
	}
	return false
}

// startThroughThisProcess makes env start etcd and kube-apiserver through
// links in dir to this program's executable, whose RunChildIfAsked makes
// them die with it, and then runs the real ones.
func startThroughThisProcess(env *envtest.Environment, dir string) error {
	if !canDieWithParent {
		return nil // the temporary files are still removed on a clean stop
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this program's executable: %w", err)
	}
	binaries := cmp.Or(env.BinaryAssetsDirectory, os.Getenv("KUBEBUILDER_ASSETS"))
	if binaries == "" {
		return fmt.Errorf("no control plane binaries: set KUBEBUILDER_ASSETS, or run `make envtest`")
	}
	if err := os.Setenv(realBinariesEnv, binaries); err != nil {
		return err
	}
	for _, name := range controlPlaneBinaries {
		if err := os.Symlink(exe, filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("linking %s: %w", name, err)
		}
	}
	env.ControlPlane.GetAPIServer().Path = filepath.Join(dir, "kube-apiserver")
	if env.ControlPlane.Etcd == nil {
		env.ControlPlane.Etcd = &envtest.Etcd{}
	}
	env.ControlPlane.Etcd.Path = filepath.Join(dir, "etcd")
	return nil
}
