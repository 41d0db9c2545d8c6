package lock

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientauthenticationv1 "k8s.io/client-go/pkg/apis/clientauthentication/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// A CI job reaches the cluster with its CI system's OIDC ID token, which the
// API server's authentication configuration trusts (docs/install.md), instead
// of a stored kubeconfig: GitHub Actions issues one on request to a job
// with `permissions: id-token: write`; GitLab puts one into each variable of
// the job's `id_tokens`.
const (
	// GitHubIDTokenURLVar and GitHubIDTokenRequestVar are what GitHub Actions
	// gives such a job: a GET of the URL, with the request token as bearer
	// token and the audience as a parameter, answers {"value": "<ID token>"}.
	GitHubIDTokenURLVar     = "ACTIONS_ID_TOKEN_REQUEST_URL"
	GitHubIDTokenRequestVar = "ACTIONS_ID_TOKEN_REQUEST_TOKEN"
)

// IDTokenSource is where a job's ID token comes from: the environment
// variable TokenEnv names (GitLab's id_tokens), else GitHub Actions' token
// endpoint, for Audience.
type IDTokenSource struct {
	Audience string
	TokenEnv string
}

// IDToken is a CI job's OIDC ID token.
type IDToken struct {
	Token string
	// Expiry is the token's exp claim, read without verifying the token
	// (the API server verifies it): when to ask for a new one.
	Expiry time.Time
}

// idTokenRefresh is how long before its expiry a token is asked for again,
// so that a request never leaves with a token about to expire.
const idTokenRefresh = time.Minute

// ExecCredential is the token as a kubeconfig's exec credential plugin
// prints it (client.authentication.k8s.io/v1), due a minute before the
// token expires: client-go runs the plugin again from then on.
func (t IDToken) ExecCredential() ([]byte, error) {
	expires := metav1.NewTime(t.Expiry.Add(-idTokenRefresh))
	return json.Marshal(clientauthenticationv1.ExecCredential{
		TypeMeta: metav1.TypeMeta{APIVersion: clientauthenticationv1.SchemeGroupVersion.String(), Kind: "ExecCredential"},
		Status:   &clientauthenticationv1.ExecCredentialStatus{Token: t.Token, ExpirationTimestamp: &expires},
	})
}

// FetchIDToken returns the job's ID token, from src in the job's
// environment env. An error says what the job lacks.
func FetchIDToken(ctx context.Context, env map[string]string, src IDTokenSource, hc *http.Client) (IDToken, error) {
	var token string
	switch {
	case src.TokenEnv != "":
		token = env[src.TokenEnv]
		if token == "" {
			return IDToken{}, fmt.Errorf("the variable %s holds no ID token: declare it in the job's id_tokens (GitLab: id_tokens: {%s: {aud: <the cluster's audience>}})",
				src.TokenEnv, src.TokenEnv)
		}
	case env[GitHubIDTokenURLVar] == "" || env[GitHubIDTokenRequestVar] == "":
		return IDToken{}, fmt.Errorf("%s is not set: the GitHub Actions job needs `permissions: id-token: write` to request an ID token "+
			"(elsewhere, name the variable that holds the token)", GitHubIDTokenURLVar)
	case src.Audience == "":
		return IDToken{}, errors.New("no audience to request the ID token for")
	default:
		var err error
		if token, err = requestGitHubIDToken(ctx, env[GitHubIDTokenURLVar], env[GitHubIDTokenRequestVar], src.Audience, hc); err != nil {
			return IDToken{}, err
		}
	}
	expiry, err := tokenExpiry(token)
	if err != nil {
		return IDToken{}, err
	}
	return IDToken{Token: token, Expiry: expiry}, nil
}

// requestGitHubIDToken asks GitHub Actions' token endpoint for a token for
// audience.
func requestGitHubIDToken(ctx context.Context, endpoint, bearer, audience string, hc *http.Client) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", fmt.Errorf("%s is no URL: %w", GitHubIDTokenURLVar, err)
	}
	q := u.Query()
	q.Set("audience", audience)
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return "", fmt.Errorf("requesting an ID token from GitHub Actions: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+bearer)
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("requesting an ID token from GitHub Actions: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return "", fmt.Errorf("reading GitHub Actions' ID token: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("requesting an ID token from GitHub Actions: %s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	var answer struct {
		Value string `json:"value"`
	}
	if err := json.Unmarshal(body, &answer); err != nil || answer.Value == "" {
		return "", fmt.Errorf("GitHub Actions answered without an ID token (%s)", resp.Status)
	}
	return answer.Value, nil
}

// tokenExpiry reads the exp claim of a JWT without verifying it. It is
// never trusted for anything but when to ask again.
func tokenExpiry(token string) (time.Time, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return time.Time{}, errors.New("the ID token is no JWT (header.payload.signature)")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, fmt.Errorf("the ID token's payload is not base64url: %w", err)
	}
	var claims struct {
		Exp int64 `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil || claims.Exp == 0 {
		return time.Time{}, errors.New("the ID token has no exp claim")
	}
	return time.Unix(claims.Exp, 0), nil
}

// OIDCCluster is the cluster a CI job reaches with its ID token.
type OIDCCluster struct {
	// Server is the API server's URL (https).
	Server string
	// CAData is the PEM of the certificate authority of the API server's
	// certificate; empty, the system's roots.
	CAData []byte
	// Namespace is the context's namespace, if any.
	Namespace string
}

// OIDCKubeconfig is a kubeconfig for cluster whose user runs command with
// args (`kubectl-buildlock oidc-token ...`) as an exec credential plugin
// whenever it needs a token: kubectl, helm and the plugin ask for a new one
// as each expires. It holds no secret.
func OIDCKubeconfig(cluster OIDCCluster, command string, args []string) ([]byte, error) {
	u, err := url.Parse(cluster.Server)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("the server must be the API server's https:// URL, not %q", cluster.Server)
	}
	const name = "buildlock-oidc"
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: cluster.Server, CertificateAuthorityData: cluster.CAData}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Exec: &clientcmdapi.ExecConfig{
		APIVersion:      "client.authentication.k8s.io/v1",
		Command:         command,
		Args:            args,
		InteractiveMode: clientcmdapi.NeverExecInteractiveMode,
	}}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name, Namespace: cluster.Namespace}
	cfg.CurrentContext = name
	if err := clientcmd.Validate(*cfg); err != nil {
		return nil, fmt.Errorf("writing the kubeconfig: %w", err)
	}
	return clientcmd.Write(*cfg)
}
