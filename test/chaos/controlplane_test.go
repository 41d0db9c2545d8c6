package chaos

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/buildlock/buildlock/internal/testenv"
)

// controlPlane is the chaos run's own control plane: one etcd and two
// kube-apiservers on it (an HA control plane), started from the binaries
// envtest uses, each a process the test can SIGKILL and start again on the
// same data directory and port. envtest's Environment cannot do either: its
// Stop is graceful, and it runs one API server.
//
// Clients authenticate with a static token in system:masters; the API
// servers serve a certificate of the plane's own CA for 127.0.0.1, so that
// a client may reach them directly, through the partition proxy, or through
// a dialer that fails over from one to the other (a load balancer).
type controlPlane struct {
	dir   string
	token string
	caPEM []byte

	etcd       *process
	etcdURL    string
	apiservers []*process
	ports      []int // the API servers' secure ports
}

// startControlPlane starts etcd and n API servers on it and installs the
// CRDs. Every process writes its output to a log file in a temporary
// directory, which is kept when the test fails.
func startControlPlane(n int) (_ *controlPlane, err error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return nil, err
	}
	bin := os.Getenv("KUBEBUILDER_ASSETS")
	if bin == "" {
		bin = filepath.Join(root, "bin", "k8s", testenv.K8sVersion)
	}
	dir, err := os.MkdirTemp("", "buildlock-chaos-plane-")
	if err != nil {
		return nil, err
	}
	cp := &controlPlane{dir: dir}
	defer func() {
		if err != nil {
			cp.stop(true)
		}
	}()
	if err := cp.writeCredentials(); err != nil {
		return nil, err
	}

	clientPort, peerPort := freePort(), freePort()
	cp.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	cp.etcd = &process{
		name: "etcd", path: filepath.Join(bin, "etcd"), logPath: filepath.Join(dir, "etcd.log"),
		args: []string{
			"--name=chaos", "--data-dir=" + filepath.Join(dir, "etcd"),
			"--listen-client-urls=" + cp.etcdURL, "--advertise-client-urls=" + cp.etcdURL,
			"--listen-peer-urls=" + peerURL, "--initial-advertise-peer-urls=" + peerURL,
			"--initial-cluster=chaos=" + peerURL,
			// A SIGKILL loses nothing the kernel already has; only a crash
			// of the machine would need the fsyncs.
			"--unsafe-no-fsync=true",
		},
		healthy: func(ctx context.Context) error { return cp.etcdHealthy(ctx) },
	}
	if err := cp.etcd.start(60 * time.Second); err != nil {
		return nil, err
	}
	for i := range n {
		if err := cp.addAPIServer(bin, i); err != nil {
			return nil, err
		}
	}
	if _, err := envtest.InstallCRDs(cp.config(0), envtest.CRDInstallOptions{
		Paths: []string{filepath.Join(root, "config", "crd", "bases")}, ErrorIfPathMissing: true,
	}); err != nil {
		return nil, fmt.Errorf("installing the CRDs: %w", err)
	}
	return cp, nil
}

func (cp *controlPlane) addAPIServer(bin string, i int) error {
	port := freePort()
	name := fmt.Sprintf("kube-apiserver-%c", 'a'+i)
	p := &process{
		name: name, path: filepath.Join(bin, "kube-apiserver"), logPath: filepath.Join(cp.dir, name+".log"),
		args: []string{
			"--etcd-servers=" + cp.etcdURL,
			"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port), "--endpoint-reconciler-type=none",
			"--cert-dir=" + filepath.Join(cp.dir, name),
			"--tls-cert-file=" + filepath.Join(cp.dir, "serving.crt"), "--tls-private-key-file=" + filepath.Join(cp.dir, "serving.key"),
			"--token-auth-file=" + filepath.Join(cp.dir, "tokens.csv"),
			"--authorization-mode=RBAC",
			"--service-account-issuer=https://127.0.0.1", "--service-account-key-file=" + filepath.Join(cp.dir, "sa.key"),
			"--service-account-signing-key-file=" + filepath.Join(cp.dir, "sa.key"),
			"--service-cluster-ip-range=10.0.0.0/24", "--disable-admission-plugins=ServiceAccount", "--allow-privileged=true",
			// Compaction is the test's to make (see compact), not the API
			// server's every five minutes.
			"--etcd-compaction-interval=0",
		},
	}
	if i == 1 {
		// The second API server serves watches from etcd itself, not from a
		// watch cache: a watch that resumes there after a compaction fails
		// with 410 Gone, as every watch does after a long disconnection, so
		// that informers and the checker have to list again.
		p.args = append(p.args, "--watch-cache=false")
	}
	p.healthy = func(ctx context.Context) error { return cp.apiserverReady(ctx, port) }
	cp.apiservers = append(cp.apiservers, p)
	cp.ports = append(cp.ports, port)
	return p.start(120 * time.Second)
}

// config is an administrator's connection to API server i.
func (cp *controlPlane) config(i int) *rest.Config {
	return cp.configFor(fmt.Sprintf("127.0.0.1:%d", cp.ports[i]))
}

// configFor is an administrator's connection to an API server at hostPort
// (an API server, or a proxy in front of one).
func (cp *controlPlane) configFor(hostPort string) *rest.Config {
	return &rest.Config{
		Host: "https://" + hostPort, BearerToken: cp.token,
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.caPEM},
		QPS:             -1, // no client-side throttling, as controller-runtime's default
	}
}

// balancedConfig is a connection that reaches whichever API server answers,
// the first one first: what a load balancer in front of an HA control plane
// gives the workload and the checker, so that they keep going while one API
// server is down. As a load balancer's health check would, it leaves an API
// server the run killed aside until it is ready again (a restarting one
// accepts connections long before it can serve them: discovery and RBAC
// fail there meanwhile), unless no other one is.
func (cp *controlPlane) balancedConfig() *rest.Config {
	cfg := cp.config(0)
	var d net.Dialer
	cfg.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
		var errs []error
		order := make([]int, 0, len(cp.ports))
		for i, p := range cp.apiservers {
			if p.ready.Load() {
				order = append(order, i)
			}
		}
		for i, p := range cp.apiservers {
			if !p.ready.Load() {
				order = append(order, i)
			}
		}
		for _, i := range order {
			c, err := d.DialContext(ctx, network, fmt.Sprintf("127.0.0.1:%d", cp.ports[i]))
			if err == nil {
				return c, nil
			}
			errs = append(errs, err)
		}
		return nil, errors.Join(errs...)
	}
	return cfg
}

// writeCredentials writes the plane's CA, the API servers' serving
// certificate for 127.0.0.1, the service-account signing key and the
// administrator's token.
func (cp *controlPlane) writeCredentials() error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	notBefore, notAfter := time.Now().Add(-time.Hour), time.Now().Add(48*time.Hour)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "buildlock-chaos-ca"},
		NotBefore: notBefore, NotAfter: notAfter, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	cp.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	saDER, err := x509.MarshalECPrivateKey(saKey)
	if err != nil {
		return err
	}
	token := make([]byte, 16)
	if _, err := rand.Read(token); err != nil {
		return err
	}
	cp.token = hex.EncodeToString(token)
	files := map[string][]byte{
		"serving.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"serving.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		"sa.key":      pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: saDER}),
		"tokens.csv":  fmt.Appendf(nil, "%s,chaos-admin,chaos-admin,\"system:masters\"\n", cp.token),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(cp.dir, name), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func (cp *controlPlane) httpClient() *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cp.caPEM)
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

func (cp *controlPlane) apiserverReady(ctx context.Context, port int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/readyz", port), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+cp.token)
	resp, err := cp.httpClient().Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("readyz: %s: %s", resp.Status, body)
	}
	return nil
}

// etcdCall posts a request to etcd's JSON gateway (its v3 API over HTTP).
func (cp *controlPlane) etcdCall(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cp.etcdURL+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("etcd %s: %s: %s", path, resp.Status, data)
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

func (cp *controlPlane) etcdHealthy(ctx context.Context) error {
	_, err := cp.etcdRevision(ctx)
	return err
}

// etcdRevision is etcd's current revision.
func (cp *controlPlane) etcdRevision(ctx context.Context) (int64, error) {
	var out struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	key := base64.StdEncoding.EncodeToString([]byte("/buildlock-chaos/probe"))
	if err := cp.etcdCall(ctx, "/v3/kv/range", map[string]any{"key": key}, &out); err != nil {
		return 0, err
	}
	return strconv.ParseInt(out.Header.Revision, 10, 64)
}

// compact compacts etcd's history up to its current revision and returns
// that revision: every watch that resumes from an older resourceVersion
// after this (a restarted watch cache, a client reconnecting to another API
// server) fails with 410 Gone and must list again.
func (cp *controlPlane) compact(ctx context.Context) (int64, error) {
	rev, err := cp.etcdRevision(ctx)
	if err != nil {
		return 0, err
	}
	err = cp.etcdCall(ctx, "/v3/kv/compaction", map[string]any{"revision": strconv.FormatInt(rev, 10), "physical": true}, nil)
	return rev, err
}

// stop kills every process; keepDir keeps the logs and data for a failed
// test.
func (cp *controlPlane) stop(keepDir bool) {
	for _, p := range cp.apiservers {
		p.kill()
	}
	if cp.etcd != nil {
		cp.etcd.kill()
	}
	if !keepDir {
		_ = os.RemoveAll(cp.dir)
	}
}

// process is one control-plane process that can be killed and started
// again with the same arguments.
type process struct {
	name, path, logPath string
	args                []string
	healthy             func(context.Context) error

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	starts int
	// ready: started and healthy, and not killed since.
	ready atomic.Bool
}

// start starts the process and waits until it is healthy.
func (p *process) start(timeout time.Duration) error {
	out, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.path, p.args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the test
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = out.Close()
		close(exited)
	}()
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.starts++
	p.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		probe, probeCancel := context.WithTimeout(ctx, 2*time.Second)
		err := p.healthy(probe)
		probeCancel()
		if err == nil {
			p.ready.Store(true)
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("%s exited before it was ready (see %s): %w", p.name, p.logPath, err)
		case <-ctx.Done():
			p.kill()
			return fmt.Errorf("%s not ready within %s (see %s): %w", p.name, timeout, p.logPath, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// kill sends SIGKILL and waits for the process to exit.
func (p *process) kill() {
	p.ready.Store(false)
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(fmt.Sprintf("finding a free port: %v", err))
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}
