package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	clientauthenticationv1 "k8s.io/client-go/pkg/apis/clientauthentication/v1"

	"sigs.k8s.io/yaml"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
	"github.com/buildlock/buildlock/pkg/lock"
)

// githubTokenEndpoint is a stub of GitHub Actions' ID token endpoint
// (ACTIONS_ID_TOKEN_REQUEST_URL): for the request token of a job it signs,
// with the suite's GitHub-shaped issuer, a token with that job's claims and
// the audience asked for.
type githubTokenEndpoint struct {
	*httptest.Server
	mu        sync.Mutex
	jobs      map[string]map[string]any // by request token
	audiences []string
}

func newGitHubTokenEndpoint(t *testing.T) *githubTokenEndpoint {
	t.Helper()
	e := &githubTokenEndpoint{jobs: map[string]map[string]any{}}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		claims, ok := e.jobs[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
		e.audiences = append(e.audiences, r.URL.Query().Get("audience"))
		e.mu.Unlock()
		if !ok {
			http.Error(w, "Bad credentials", http.StatusUnauthorized)
			return
		}
		all := map[string]any{"aud": r.URL.Query().Get("audience")}
		for k, v := range claims {
			all[k] = v
		}
		token, err := githubIssuer.Token(all)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"count": 1, "value": token})
	}))
	t.Cleanup(e.Close)
	return e
}

// job registers a run of a workflow of repository (in the acme
// organization that examples/github-actions/authentication.yaml trusts)
// and returns the GitHub variables of a job of it that may request ID
// tokens: the build's, and the token endpoint's.
func (e *githubTokenEndpoint) job(repository, runID string) map[string]string {
	request := "request-" + repository + "-" + runID
	e.mu.Lock()
	e.jobs[request] = map[string]any{
		"sub": "repo:" + repository + ":ref:refs/heads/main", "ref": "refs/heads/main", "repository": repository,
		"repository_id": "690112342", "repository_owner": "acme", "repository_owner_id": "81563142",
		"run_id": runID, "run_attempt": "1", "job_workflow_ref": repository + "/.github/workflows/deploy.yaml@refs/heads/main",
	}
	e.mu.Unlock()
	return map[string]string{
		"GITHUB_ACTIONS": "true", "GITHUB_REPOSITORY": repository, "GITHUB_REF_NAME": "main", "GITHUB_RUN_NUMBER": "42",
		"GITHUB_RUN_ID": runID, "GITHUB_RUN_ATTEMPT": "1",
		lock.GitHubIDTokenURLVar: e.URL + "/_apis/distributedtask/token?api-version=2.0", lock.GitHubIDTokenRequestVar: request,
	}
}

// TestOIDCTokenPrintsAnExecCredential: oidc-token prints the job's token
// as client-go's exec credential plugins do, due a minute before it
// expires.
func TestOIDCTokenPrintsAnExecCredential(t *testing.T) {
	payload := base64.RawURLEncoding.EncodeToString([]byte(`{"aud":"https://k8s.example.com","exp":1796140800}`))
	token := "eyJhbGciOiJSUzI1NiJ9." + payload + ".c2ln"
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"oidc-token", "--token-env", "BUILDLOCK_ID_TOKEN"},
		genericiooptions.IOStreams{Out: &out, ErrOut: &errOut}, []string{"BUILDLOCK_ID_TOKEN=" + token})
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var cred clientauthenticationv1.ExecCredential
	if err := json.Unmarshal(out.Bytes(), &cred); err != nil {
		t.Fatal(err)
	}
	if cred.APIVersion != "client.authentication.k8s.io/v1" || cred.Kind != "ExecCredential" || cred.Status == nil ||
		cred.Status.Token != token || cred.Status.ExpirationTimestamp.Unix() != 1796140800-60 {
		t.Errorf("printed %s", out.String())
	}
	for args, want := range map[string]string{
		"oidc-token":                            "--audience (GitHub Actions) or --token-env",
		"oidc-token --audience a --token-env T": "not both",
		"oidc-kubeconfig --audience a":          "--server is required",
		"oidc-kubeconfig --server https://k8s.acme.example --audience a": "--namespace is required",
	} {
		errOut.Reset()
		if code := run(context.Background(), strings.Fields(args), genericiooptions.IOStreams{Out: &out, ErrOut: &errOut}, nil); code != exitUsage ||
			!strings.Contains(errOut.String(), want) {
			t.Errorf("%s: exit %d, %q; want %d and %q", args, code, errOut.String(), exitUsage, want)
		}
	}
}

// TestAGitHubJobClaimsWithItsOIDCToken (issue 25): a GitHub Actions job
// without any stored credential: oidc-kubeconfig writes its kubeconfig,
// whose exec credential requests the job's ID token from GitHub's token
// endpoint (a stub here) whenever the plugin connects, and the real API
// server authenticates it as the workflow's repository and run. The claim
// carries that verified identity, and a claim for another repository is
// refused.
func TestAGitHubJobClaimsWithItsOIDCToken(t *testing.T) {
	f := newFixture(t)
	// The example's RoleBinding, in the test's namespace.
	data, err := os.ReadFile(filepath.Join("..", "..", "examples", "github-actions", "rbac-oidc.yaml"))
	must(t, err)
	binding := &rbacv1.RoleBinding{}
	must(t, yaml.UnmarshalStrict(data, binding))
	if binding.RoleRef.Name != pipelineRole {
		t.Fatalf("examples/github-actions/rbac-oidc.yaml binds %s, want %s", binding.RoleRef.Name, pipelineRole)
	}
	binding.Namespace = f.ns
	must(t, admin.Create(context.Background(), binding))
	endpoint := newGitHubTokenEndpoint(t)
	shop := endpoint.job("acme/shop", "5005")
	ca := base64.StdEncoding.EncodeToString(adminCfg.CAData)
	// No kubeconfig at all: the job has no credential of its own.
	code, p := f.runAs("/nonexistent", shop, "oidc-kubeconfig", "--server", serverURL(t, adminCfg),
		"--certificate-authority-data", ca, "--audience", "https://k8s.acme.example", "-n", f.ns)
	if code != exitOK {
		t.Fatalf("oidc-kubeconfig exited %d; stderr:\n%s", code, p.stderr)
	}
	kubeconfig := filepath.Join(f.dir, "oidc.kubeconfig")
	must(t, os.WriteFile(kubeconfig, []byte(p.stdout.String()), 0o600))
	if strings.Contains(p.stdout.String(), "request-acme") {
		t.Errorf("the kubeconfig holds the job's request token:\n%s", p.stdout)
	}

	env, cmd := f.helper("shop", 0, 0)
	for k, v := range shop {
		env[k] = v
	}
	acquire := f.pluginAs(kubeconfig, env, append([]string{"acquire", "--target", "staging", "--timeout", "30s"}, cmd...)...)
	if code := acquire.wait(t, time.Minute); code != exitOK {
		t.Fatalf("acquire exited %d; stderr:\n%s", code, acquire.stderr)
	}
	if r, ran := f.helperRun("shop"); !ran || r.token != "1" {
		t.Errorf("the command ran %v with token %q, want it run holding token 1", ran, r.token)
	}
	endpoint.mu.Lock()
	audiences := endpoint.audiences
	endpoint.mu.Unlock()
	if len(audiences) == 0 || audiences[0] != "https://k8s.acme.example" {
		t.Errorf("the token endpoint was asked for audiences %q, want https://k8s.acme.example", audiences)
	}

	// The claim, left without a command, shows who created it.
	code2, p2 := f.runAs(kubeconfig, shop, "acquire", "--target", "docs", "--timeout", "30s")
	if code2 != exitOK {
		t.Fatalf("acquire exited %d; stderr:\n%s", code2, p2.stderr)
	}
	bl := f.get("acme-shop-main-42-docs")
	if want := (&buildlockv1.Requester{Username: "github:acme/shop", Repository: "acme/shop", Run: "5005/1"}); bl == nil || *bl.Spec.Requester != *want {
		t.Errorf("the claim is %+v, want it created by %+v", bl, want)
	}

	// A workflow of acme/web that claims to be acme/shop's is refused.
	liar := endpoint.job("acme/web", "6006")
	liar["GITHUB_REPOSITORY"] = "acme/shop"
	code3, p3 := f.runAs(kubeconfig, liar, "acquire", "--target", "staging", "--timeout", "30s")
	if code3 != exitError || !strings.Contains(p3.stderr.String(), "spec.repo must be acme/web, not acme/shop") {
		t.Errorf("a claim for another repository: exit %d; stderr:\n%s", code3, p3.stderr)
	}
}

// runAs runs the plugin with kubeconfig to its end and returns its exit
// code.
func (f *fixture) runAs(kubeconfig string, env map[string]string, args ...string) (int, *proc) {
	f.t.Helper()
	p := f.pluginAs(kubeconfig, env, args...)
	return p.wait(f.t, time.Minute), p
}
