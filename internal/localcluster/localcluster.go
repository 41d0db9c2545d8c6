// Package localcluster starts the throwaway control plane of `make run`, `make demo`
// and the chart test: the etcd and kube-apiserver that the tests use
// (internal/testenv), with a kubeconfig written to a temporary directory so
// that kubectl, helm and the manager binary can reach it. Stop stops the
// control plane and removes every file it wrote.
package localcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/buildlock/buildlock/internal/testenv"
)

// ContextName names the cluster, user and context in the kubeconfigs this
// package writes.
const ContextName = "buildlock-local"

// Options shape the control plane.
type Options struct {
	// WithoutCRDs starts the API server without the BuildLock CRD and the
	// admission policies, for a caller that installs them itself (the chart
	// test installs the chart's copies with helm).
	WithoutCRDs bool
	// DieWithThisProcess makes etcd and kube-apiserver die with this
	// process on Linux, however it ends (killed, or by a signal it did
	// not handle): they are started through this program's executable,
	// whose main must call RunChildIfAsked first (`make run`'s does).
	DieWithThisProcess bool
}

// Cluster is a running local control plane.
type Cluster struct {
	// Env is the envtest environment running etcd and kube-apiserver.
	Env *testenv.Environment
	// Config is an administrator's (system:masters) connection.
	Config *rest.Config
	// Dir is the temporary directory holding Kubeconfig (and the links
	// of DieWithThisProcess); Stop removes it.
	Dir string
	// Kubeconfig is the path of an administrator's kubeconfig.
	Kubeconfig string
	// Root is the repository root.
	Root string
}

// Start starts etcd and kube-apiserver (installing the BuildLock CRD unless
// o.WithoutCRDs) and writes an administrator's kubeconfig.
func Start(o Options) (_ *Cluster, err error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return nil, err
	}
	var opts []testenv.Option
	if o.WithoutCRDs {
		opts = append(opts, testenv.WithoutIdentityPolicies())
	}
	env, err := testenv.New(opts...)
	if err != nil {
		return nil, err
	}
	if o.WithoutCRDs {
		env.CRDDirectoryPaths = nil
		env.ErrorIfCRDPathMissing = false
	}
	if env.BinaryAssetsDirectory != "" {
		if _, err := os.Stat(filepath.Join(env.BinaryAssetsDirectory, "kube-apiserver")); err != nil {
			return nil, fmt.Errorf("no control plane in %s: run `make envtest` to build it", env.BinaryAssetsDirectory)
		}
	}
	dir, err := os.MkdirTemp("", "buildlock-local-")
	if err != nil {
		return nil, fmt.Errorf("creating a directory for the kubeconfig: %w", err)
	}
	c := &Cluster{Root: root, Dir: dir}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Stop())
		}
	}()
	if o.DieWithThisProcess {
		if err := startThroughThisProcess(env.Environment, dir); err != nil {
			return nil, err
		}
	}
	cfg, err := env.Start()
	if err != nil {
		// envtest leaves etcd and kube-apiserver running when a later step
		// (installing the CRD) fails.
		return nil, errors.Join(fmt.Errorf("starting the local control plane: %w", err), env.Stop())
	}
	c.Env, c.Config = env, cfg
	if !o.WithoutCRDs {
		// The identity policies of every installation (env.Start installed
		// them) and the fence of an enforcing one, so that a BuildLockPolicy
		// with spec.enforce can be tried here.
		if err := testenv.InstallEnforcement(context.Background(), cfg); err != nil {
			return nil, err
		}
	}

	// A user of its own rather than envtest's default one, so that the
	// kubeconfig stays valid whatever envtest does with its own files.
	admin, err := env.AddUser(envtest.User{Name: "buildlock-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, fmt.Errorf("provisioning an administrator: %w", err)
	}
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	if err := WriteKubeconfig(c.Kubeconfig, admin.Config(), nil); err != nil {
		return nil, err
	}
	return c, nil
}

// Stop stops the control plane and removes the kubeconfig directory; envtest
// removes its own certificates and etcd data.
func (c *Cluster) Stop() error {
	var errs []error
	if c.Env != nil {
		if err := c.Env.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stopping the control plane: %w", err))
		}
	}
	if c.Dir != "" {
		if err := os.RemoveAll(c.Dir); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", c.Dir, err))
		}
	}
	return errors.Join(errs...)
}

// Kubectl returns a kubectl command against this control plane: $KUBECTL
// when set, else the kubectl that `make envtest` built.
func (c *Cluster) Kubectl(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, KubectlPath(c.Root), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
}

// KubectlPath is $KUBECTL when set, else bin/k8s/<version>/kubectl under root.
func KubectlPath(root string) string {
	if p := os.Getenv("KUBECTL"); p != "" {
		return p
	}
	return filepath.Join(binDir(root), "kubectl")
}

// binDir is where `make envtest` builds the control plane.
func binDir(root string) string {
	return filepath.Join(root, "bin", "k8s", testenv.K8sVersion)
}

// WriteKubeconfig writes a kubeconfig for cfg (certificate or token
// credentials, as envtest issues them) to path, readable by its owner only.
// With imp set, every request impersonates imp's user and groups.
func WriteKubeconfig(path string, cfg *rest.Config, imp *rest.ImpersonationConfig) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters[ContextName] = &clientcmdapi.Cluster{
		Server:                   cfg.Host,
		CertificateAuthorityData: cfg.CAData,
	}
	user := &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData,
		ClientKeyData:         cfg.KeyData,
		Token:                 cfg.BearerToken,
	}
	if imp != nil {
		user.Impersonate = imp.UserName
		user.ImpersonateGroups = imp.Groups
	}
	kc.AuthInfos[ContextName] = user
	kc.Contexts[ContextName] = &clientcmdapi.Context{Cluster: ContextName, AuthInfo: ContextName}
	kc.CurrentContext = ContextName
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return nil
}
