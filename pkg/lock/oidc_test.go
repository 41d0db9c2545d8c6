package lock

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
)

// fakeJWT is a token shaped like a JWT whose payload is claims (unsigned:
// FetchIDToken never verifies, the API server does).
func fakeJWT(t *testing.T, claims map[string]any) string {
	t.Helper()
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256","typ":"JWT"}`)) + "." + enc(payload) + "." + enc([]byte("signature"))
}

// githubTokenEndpoint is a stub of GitHub Actions' ID token endpoint: it
// answers a request with the right bearer token with token, and records
// the audiences asked for.
type githubTokenEndpoint struct {
	*httptest.Server
	mu        sync.Mutex
	audiences []string
}

func newGitHubTokenEndpoint(t *testing.T, bearer, token string) *githubTokenEndpoint {
	t.Helper()
	e := &githubTokenEndpoint{}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+bearer || r.URL.Query().Get("api-version") != "2.0" {
			http.Error(w, `{"message":"Bad credentials"}`, http.StatusUnauthorized)
			return
		}
		e.mu.Lock()
		e.audiences = append(e.audiences, r.URL.Query().Get("audience"))
		e.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]any{"count": 1, "value": token})
	}))
	t.Cleanup(e.Close)
	return e
}

func TestFetchIDToken(t *testing.T) {
	exp := time.Date(2026, 12, 1, 10, 5, 0, 0, time.UTC)
	token := fakeJWT(t, map[string]any{"iss": "https://token.actions.githubusercontent.com", "aud": "https://k8s.example.com", "exp": exp.Unix()})
	endpoint := newGitHubTokenEndpoint(t, "request-token", token)
	github := map[string]string{
		GitHubIDTokenURLVar:     endpoint.URL + "/_apis/distributedtask/token?api-version=2.0",
		GitHubIDTokenRequestVar: "request-token",
	}
	for name, tc := range map[string]struct {
		env  map[string]string
		src  IDTokenSource
		want string // the error's text; "" for the token
	}{
		"GitHub Actions, for the audience": {env: github, src: IDTokenSource{Audience: "https://k8s.example.com"}},
		"GitLab's id_tokens variable":      {env: map[string]string{"BUILDLOCK_ID_TOKEN": token}, src: IDTokenSource{TokenEnv: "BUILDLOCK_ID_TOKEN"}},
		"a GitHub job without id-token: write": {
			env: map[string]string{}, src: IDTokenSource{Audience: "x"}, want: "needs `permissions: id-token: write`",
		},
		"GitLab without the id_tokens entry": {
			env: github, src: IDTokenSource{TokenEnv: "BUILDLOCK_ID_TOKEN"}, want: "declare it in the job's id_tokens",
		},
		"GitHub refuses the request token": {
			env: map[string]string{GitHubIDTokenURLVar: github[GitHubIDTokenURLVar], GitHubIDTokenRequestVar: "stale"},
			src: IDTokenSource{Audience: "x"}, want: "401 Unauthorized: {\"message\":\"Bad credentials\"}",
		},
		"no JWT in the variable": {
			env: map[string]string{"T": "not-a-jwt"}, src: IDTokenSource{TokenEnv: "T"}, want: "no JWT",
		},
		"a JWT without exp": {
			env: map[string]string{"T": fakeJWT(t, map[string]any{"aud": "x"})}, src: IDTokenSource{TokenEnv: "T"}, want: "no exp claim",
		},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := FetchIDToken(context.Background(), tc.env, tc.src, http.DefaultClient)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("err %v, want one with %q", err, tc.want)
				}
				return
			}
			if err != nil || got.Token != token || !got.Expiry.Equal(exp) {
				t.Fatalf("got %+v, %v; want the token expiring at %s", got, err, exp)
			}
		})
	}
	if want := []string{"https://k8s.example.com"}; len(endpoint.audiences) != 1 || endpoint.audiences[0] != want[0] {
		t.Errorf("the endpoint was asked for %q, want %q", endpoint.audiences, want)
	}
}

func TestOIDCKubeconfig(t *testing.T) {
	ca := []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	data, err := OIDCKubeconfig(OIDCCluster{Server: "https://k8s.example.com:6443", CAData: ca, Namespace: "ci"},
		"/opt/bin/kubectl-buildlock", []string{"oidc-token", "--audience", "https://k8s.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.Load(data)
	if err != nil {
		t.Fatal(err)
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	cluster, user := cfg.Clusters[ctx.Cluster], cfg.AuthInfos[ctx.AuthInfo]
	if cluster.Server != "https://k8s.example.com:6443" || string(cluster.CertificateAuthorityData) != string(ca) || ctx.Namespace != "ci" {
		t.Errorf("cluster %+v, namespace %q", cluster, ctx.Namespace)
	}
	if e := user.Exec; e == nil || e.Command != "/opt/bin/kubectl-buildlock" || strings.Join(e.Args, " ") != "oidc-token --audience https://k8s.example.com" ||
		e.APIVersion != "client.authentication.k8s.io/v1" || e.InteractiveMode != "Never" {
		t.Errorf("the user is %+v, want the plugin as its exec credential", user)
	}
	if user.Token != "" || user.TokenFile != "" || len(user.ClientKeyData) > 0 {
		t.Errorf("the kubeconfig holds a credential: %+v", user)
	}
	for _, server := range []string{"http://k8s.example.com", "k8s.example.com:6443", ""} {
		if _, err := OIDCKubeconfig(OIDCCluster{Server: server}, "kubectl-buildlock", nil); err == nil || !strings.Contains(err.Error(), "https:// URL") {
			t.Errorf("server %q: %v, want it refused", server, err)
		}
	}
}
