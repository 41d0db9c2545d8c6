package examples

import (
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// The cluster's audience, as examples/*/authentication.yaml trust it.
const oidcAudience = "https://k8s.acme.example"

// fakeIDToken is shaped like a CI system's ID token, with claims and an
// expiry; the stubs never verify it (the API server would).
func fakeIDToken(t *testing.T, claims map[string]any) string {
	t.Helper()
	all := map[string]any{"exp": time.Now().Add(5 * time.Minute).Unix()}
	for k, v := range claims {
		all[k] = v
	}
	payload, err := json.Marshal(all)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256","kid":"stub","typ":"JWT"}`)) + "." + enc(payload) + "." + enc([]byte(t.Name()))
}

// tokenEndpoint is a stub of GitHub Actions' ID token endpoint: to the
// job's request token it answers a new token for the audience asked for,
// and records what it issued.
type tokenEndpoint struct {
	*httptest.Server
	request string
	mu      sync.Mutex
	issued  map[string]string // token -> audience
}

func newTokenEndpoint(t *testing.T) *tokenEndpoint {
	t.Helper()
	e := &tokenEndpoint{request: "request-token-of-" + t.Name(), issued: map[string]string{}}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+e.request {
			http.Error(w, "Bad credentials", http.StatusUnauthorized)
			return
		}
		aud := r.URL.Query().Get("audience")
		token := fakeIDToken(t, map[string]any{"aud": aud, "repository": "acme/shop", "jti": fmt.Sprint(time.Now().UnixNano())})
		e.mu.Lock()
		e.issued[token] = aud
		e.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]any{"count": 1, "value": token})
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *tokenEndpoint) tokens() map[string]string {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string]string{}
	for k, v := range e.issued {
		out[k] = v
	}
	return out
}

// fakeAPIServer stands in for the cluster: it answers /version over TLS and
// records the bearer tokens it was shown.
type fakeAPIServer struct {
	*httptest.Server
	mu     sync.Mutex
	bearer []string
}

func newFakeAPIServer(t *testing.T) *fakeAPIServer {
	t.Helper()
	s := &fakeAPIServer{}
	s.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.bearer = append(s.bearer, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"major":"1","minor":"37","gitVersion":"v1.37.2"}`))
	}))
	t.Cleanup(s.Close)
	return s
}

// caData is the server's certificate authority as a kubeconfig has it.
func (s *fakeAPIServer) caData() string {
	return base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw}))
}

func (s *fakeAPIServer) tokens() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.bearer...)
}

// assertNoTokenIn fails if any token appears in a stub's arguments or in
// the run's output: tokens travel through the environment and exec
// credentials only.
func assertNoTokenIn(t *testing.T, calls []call, output string, tokens ...string) {
	t.Helper()
	for _, token := range tokens {
		if strings.Contains(output, token) {
			t.Errorf("the run's output shows an ID token")
		}
		for _, c := range calls {
			if strings.Contains(strings.Join(c.Args, " "), token) {
				t.Errorf("%s was given an ID token as an argument: %q", c.Name, c.Args)
			}
		}
	}
}

// oidcWorkflow uses the action with the job's OIDC token, then reaches the
// cluster again in a later step, as a deploy's smoke test would.
func oidcWorkflow(permissions any, with map[string]any) ghWorkflow {
	return ghWorkflow{Jobs: map[string]ghJob{"deploy": {Permissions: permissions, Steps: []ghStep{
		{ID: "lock", Uses: "buildlock/buildlock@v0.2.0", With: with},
		{Name: "smoke test", Shell: "bash", Run: "./deploy.sh smoke-test"},
	}}}}
}

// TestActionReachesTheClusterWithTheJobsOIDCToken (issue 25): with
// oidc-audience, the action needs no stored kubeconfig: the kubeconfig it
// writes asks GitHub's token endpoint for the job's ID token, for that
// audience, whenever a client of the job connects (the command under the
// lock, and the job's later steps), and no token is ever an argument, in
// the log or in the kubeconfig.
func TestActionReachesTheClusterWithTheJobsOIDCToken(t *testing.T) {
	for name, permissions := range map[string]any{
		"the job's permissions": map[string]any{"id-token": "write", "contents": "read"},
		"write-all":             "write-all",
	} {
		t.Run(name, func(t *testing.T) {
			api, endpoint := newFakeAPIServer(t), newTokenEndpoint(t)
			s := newStubs(t)
			r := newGHRun(t, s, defaultGHEvent(), "STUB_RELEASES="+fakeRelease(t, "v0.2.0"), "STUB_DEPLOY_CONNECTS=1")
			r.idTokenURL, r.idTokenRequest = endpoint.URL+"/_apis/distributedtask/token?api-version=2.0", endpoint.request
			r.runWorkflow(oidcWorkflow(permissions, map[string]any{
				"target": "staging", "command": "./deploy.sh staging", "namespace": "ci",
				"oidc-audience": oidcAudience, "server": api.URL, "certificate-authority-data": api.caData(),
			}))
			out := r.output.String()
			if r.status["deploy"] != jobPassed {
				t.Fatalf("job %s; output:\n%s", r.status["deploy"], out)
			}
			issued := endpoint.tokens()
			seen := api.tokens()
			if len(seen) < 2 {
				t.Fatalf("the cluster was reached %d times, want by the command and the later step; output:\n%s", len(seen), out)
			}
			for _, token := range seen {
				if aud, ok := issued[token]; !ok || aud != oidcAudience {
					t.Errorf("the cluster was shown %.20s..., which GitHub issued for audience %q (issued: %v), want %q", token, aud, ok, oidcAudience)
				}
			}
			calls := s.calls(t)
			acq := acquires(calls)
			if len(acq) != 1 {
				t.Fatalf("%d acquire calls", len(acq))
			}
			kubeconfig := acq[0].Env["KUBECONFIG"]
			if filepath.Base(kubeconfig) != "buildlock-oidc.kubeconfig" {
				t.Fatalf("acquire ran with KUBECONFIG %q, want the action's", kubeconfig)
			}
			data, err := os.ReadFile(kubeconfig)
			if err != nil {
				t.Fatal(err)
			}
			if info, _ := os.Stat(kubeconfig); info.Mode().Perm() != 0o600 {
				t.Errorf("the kubeconfig is %v, want 0600", info.Mode().Perm())
			}
			tokens := append(seen, endpoint.request)
			assertNoTokenIn(t, calls, out+string(data), tokens...)
			assertKubeconfigNamespace(t, data, "ci")
		})
	}
}

// TestActionOIDCNeedsThePermissionAndTheServer: without id-token: write,
// the server or the claims' namespace (the kubeconfig names it: without it
// the job's claims would go to default, where the cluster grants nothing),
// the action says what is missing before claiming.
func TestActionOIDCNeedsThePermissionAndTheServer(t *testing.T) {
	endpoint := newTokenEndpoint(t)
	for name, tc := range map[string]struct {
		permissions any
		with        map[string]any
		want        string
	}{
		"no id-token permission": {
			permissions: map[string]any{"contents": "read"},
			with:        map[string]any{"server": "https://k8s.acme.example:6443"},
			want:        "give the job 'permissions: id-token: write'",
		},
		"no server": {
			permissions: map[string]any{"id-token": "write"},
			with:        map[string]any{"namespace": "ci"},
			want:        "oidc-audience needs server",
		},
		"no namespace": {
			permissions: map[string]any{"id-token": "write"},
			with:        map[string]any{"server": "https://k8s.acme.example:6443"},
			want:        "oidc-audience needs namespace",
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := newStubs(t)
			r := newGHRun(t, s, defaultGHEvent(), "STUB_RELEASES="+fakeRelease(t, "v0.2.0"))
			r.idTokenURL, r.idTokenRequest = endpoint.URL, endpoint.request
			with := map[string]any{"target": "staging", "command": "./deploy.sh staging", "oidc-audience": oidcAudience}
			for k, v := range tc.with {
				with[k] = v
			}
			r.runWorkflow(oidcWorkflow(tc.permissions, with))
			if r.status["deploy"] != jobFailed || len(acquires(s.calls(t))) != 0 {
				t.Errorf("job %s, want failed before acquiring", r.status["deploy"])
			}
			assertContains(t, r.output.String(), tc.want)
		})
	}
}

// TestGitLabComponentReachesTheClusterWithTheJobsIDToken (issue 25): with
// oidc: true, the component's job declares an ID token for oidc-audience
// (id_tokens) and reaches the cluster with it instead of a KUBECONFIG
// variable; the token is never an argument or in the log.
func TestGitLabComponentReachesTheClusterWithTheJobsIDToken(t *testing.T) {
	api := newFakeAPIServer(t)
	top, err := gitlabInclude(t, map[string]any{"include": []any{map[string]any{
		"component": "gitlab.example.com/platform/buildlock/buildlock@v0.2.0",
		"inputs": map[string]any{
			"target": "staging", "image": "deploy", "command": "./deploy.sh staging", "namespace": "ci",
			"oidc": true, "oidc-audience": oidcAudience, "server": api.URL, "certificate-authority-data": api.caData(),
		},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	p := gitlabPipelineOf(t, "a pipeline with the component", top)
	if aud := p.jobs["deploy-staging"].IDTokens["BUILDLOCK_ID_TOKEN"].Aud; aud != oidcAudience {
		t.Fatalf("the job's id_tokens are %v, want BUILDLOCK_ID_TOKEN for %s", p.jobs["deploy-staging"].IDTokens, oidcAudience)
	}
	s := newStubs(t)
	run := runGitLab(t, s, p, gitlabPredefined(), []string{"STUB_DEPLOY_CONNECTS=1"})
	out := run.output.String()
	if run.status["deploy-staging"] != jobPassed {
		t.Fatalf("jobs %v; output:\n%s", run.status, out)
	}
	seen := api.tokens()
	if len(seen) == 0 || !strings.Contains(string(mustDecodePayload(t, seen[0])), `"aud":"`+oidcAudience+`"`) {
		t.Fatalf("the cluster was shown %v, want the job's ID token for %s; output:\n%s", seen, oidcAudience, out)
	}
	assertNoTokenIn(t, s.calls(t), out, seen[0])
	acq := acquires(s.calls(t))
	if len(acq) != 1 {
		t.Fatalf("%d acquire calls", len(acq))
	}
	data, err := os.ReadFile(acq[0].Env["KUBECONFIG"])
	if err != nil {
		t.Fatal(err)
	}
	assertKubeconfigNamespace(t, data, "ci")

	// Without oidc the job declares no ID token: GitLab mints none.
	plain, err := gitlabInclude(t, map[string]any{"include": []any{map[string]any{
		"component": "gitlab.example.com/platform/buildlock/buildlock@v0.2.0",
		"inputs":    map[string]any{"target": "staging", "image": "deploy", "command": "./deploy.sh staging"},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if tokens := gitlabPipelineOf(t, "a pipeline with the component", plain).jobs["deploy-staging"].IDTokens; len(tokens) != 0 {
		t.Errorf("without oidc the job has id_tokens %v", tokens)
	}
}

func mustDecodePayload(t *testing.T, token string) []byte {
	t.Helper()
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		t.Fatalf("%q is no JWT", token)
	}
	data, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestInstallDocsShowTheExampleAuthenticationConfigs: docs/install.md shows
// each example's authentication configuration as it is, from its
// apiVersion on; the test API server runs with these very files
// (internal/controller's suite).
func TestInstallDocsShowTheExampleAuthenticationConfigs(t *testing.T) {
	doc := mustRead(t, "docs/install.md")
	for _, file := range []string{"examples/github-actions/authentication.yaml", "examples/gitlab/authentication.yaml"} {
		_, body, ok := strings.Cut(mustRead(t, file), "\napiVersion:")
		if !ok || !strings.Contains(doc, "```yaml\napiVersion:"+body+"```") {
			t.Errorf("docs/install.md does not show %s as it is", file)
		}
	}
}

// assertKubeconfigNamespace fails unless the kubeconfig's current context
// names namespace.
func assertKubeconfigNamespace(t *testing.T, data []byte, namespace string) {
	t.Helper()
	cfg, err := clientcmd.Load(data)
	if err != nil {
		t.Fatal(err)
	}
	if ctx := cfg.Contexts[cfg.CurrentContext]; ctx == nil || ctx.Namespace != namespace {
		t.Errorf("the kubeconfig's context is %+v, want namespace %s:\n%s", ctx, namespace, data)
	}
}

// TestInstallDocsOIDCSnippetsNameTheNamespace: every snippet of
// docs/install.md's "In the pipeline" names the claims' namespace, where
// "The pipelines' rights" binds buildlock-pipeline (ci), so that a reader
// who copies one is not forbidden in default.
func TestInstallDocsOIDCSnippetsNameTheNamespace(t *testing.T) {
	doc := mustRead(t, "docs/install.md")
	_, section, ok := strings.Cut(doc, "\n### In the pipeline\n")
	if !ok {
		t.Fatal(`docs/install.md has no "In the pipeline" section`)
	}
	section, _, _ = strings.Cut(section, "\n### ")
	blocks := regexp.MustCompile("(?s)```(yaml|sh)\n(.*?)```").FindAllStringSubmatch(section, -1)
	if len(blocks) < 3 {
		t.Fatalf("%d snippets in \"In the pipeline\", want the action's, the component's and the plugin's", len(blocks))
	}
	for _, b := range blocks {
		if !regexp.MustCompile(`namespace: ci\b|--namespace ci\b|-n ci\b`).MatchString(b[2]) {
			t.Errorf("this snippet of \"In the pipeline\" names no namespace (the claims would go to default):\n%s", b[2])
		}
	}
}
