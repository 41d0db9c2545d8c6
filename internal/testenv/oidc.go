package testenv

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	apiserverv1 "k8s.io/apiserver/pkg/apis/apiserver/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// WithAuthentication makes the API server authenticate bearer tokens as
// config says (kube-apiserver --authentication-config: JWT authenticators,
// such as the OIDC issuers of CI systems), besides envtest's own client
// certificates. The file is written into dir, which must outlive the
// environment.
func WithAuthentication(dir string, config *apiserverv1.AuthenticationConfiguration) Option {
	return func(env *Environment) error {
		config = config.DeepCopy()
		config.APIVersion, config.Kind = apiserverv1.SchemeGroupVersion.String(), "AuthenticationConfiguration"
		data, err := yaml.Marshal(config)
		if err != nil {
			return fmt.Errorf("encoding the authentication configuration: %w", err)
		}
		path := filepath.Join(dir, "authentication-config.yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return fmt.Errorf("writing the authentication configuration: %w", err)
		}
		env.ControlPlane.GetAPIServer().Configure().Set("authentication-config", path)
		return nil
	}
}

// OIDCIssuer is an OpenID Connect issuer in this process, as the API
// server sees a CI system's (GitHub Actions', GitLab's): it serves its
// discovery document and its signing keys over TLS, and signs ID tokens
// with the claims a test gives. Its URL, the issuer that tokens name (their
// iss claim), may be a real issuer's, such as
// https://token.actions.githubusercontent.com: the API server is pointed
// at this server's discovery document (Trust), which names this server's
// keys.
type OIDCIssuer struct {
	// URL is the issuer's identifier.
	URL    string
	server *httptest.Server
	signer jose.Signer
}

// oidcKeyID names the issuer's one signing key in its key set and tokens.
const oidcKeyID = "buildlock-test"

// discoveryPath and keysPath are where the issuer serves its discovery
// document and its key set.
const (
	discoveryPath = "/.well-known/openid-configuration"
	keysPath      = "/.well-known/jwks"
)

// StartOIDCIssuer starts an issuer whose tokens name url as their issuer.
func StartOIDCIssuer(url string) (*OIDCIssuer, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("generating the issuer's key: %w", err)
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: key, KeyID: oidcKeyID}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		return nil, fmt.Errorf("creating the issuer's signer: %w", err)
	}
	keys := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: oidcKeyID, Algorithm: string(jose.RS256), Use: "sig"}}}
	i := &OIDCIssuer{URL: url, signer: signer}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+discoveryPath, func(w http.ResponseWriter, _ *http.Request) {
		// The fields GitHub's and GitLab's discovery documents have that
		// the API server reads.
		writeJSON(w, map[string]any{
			"issuer":                                i.URL,
			"jwks_uri":                              i.server.URL + keysPath,
			"response_types_supported":              []string{"id_token"},
			"subject_types_supported":               []string{"public", "pairwise"},
			"id_token_signing_alg_values_supported": []string{string(jose.RS256)},
		})
	})
	mux.HandleFunc("GET "+keysPath, func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, keys) })
	i.server = httptest.NewTLSServer(mux)
	return i, nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// Close stops the issuer.
func (i *OIDCIssuer) Close() { i.server.Close() }

// Trust returns authenticator a (whose issuer must be this one's URL) with
// the API server pointed at this server: its discovery document
// (issuer.discoveryURL) and the certificate authority of its TLS
// certificate. Everything else, the audiences, claim validation rules and
// mappings, is a's, as a cluster would be configured.
func (i *OIDCIssuer) Trust(a apiserverv1.JWTAuthenticator) (apiserverv1.JWTAuthenticator, error) {
	if a.Issuer.URL != i.URL {
		return a, fmt.Errorf("the authenticator trusts issuer %q, not %q", a.Issuer.URL, i.URL)
	}
	a = *a.DeepCopy()
	a.Issuer.DiscoveryURL = ptr.To(i.server.URL + discoveryPath)
	a.Issuer.CertificateAuthority = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: i.server.Certificate().Raw}))
	return a, nil
}

// Token signs an ID token with claims, and with the issuer (iss), the
// times (iat and nbf now, exp in ten minutes) and an id (jti) unless claims
// set them.
func (i *OIDCIssuer) Token(claims map[string]any) (string, error) {
	if i == nil {
		return "", errors.New("no issuer")
	}
	now := time.Now()
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	all := map[string]any{
		"iss": i.URL, "iat": now.Unix(), "nbf": now.Unix(), "exp": now.Add(10 * time.Minute).Unix(), "jti": fmt.Sprintf("%x", id),
	}
	maps.Copy(all, claims)
	token, err := jwt.Signed(i.signer).Claims(all).Serialize()
	if err != nil {
		return "", fmt.Errorf("signing a token: %w", err)
	}
	return token, nil
}

// AuthenticationFrom reads the JWT authenticators of the
// AuthenticationConfiguration files (paths from the repository root, such
// as the examples' configurations for GitHub and GitLab) into one
// configuration, each pointed at the issuer among issuers that it trusts
// (Trust): the test API server then authenticates as those files configure
// a cluster.
func AuthenticationFrom(issuers []*OIDCIssuer, files ...string) (*apiserverv1.AuthenticationConfiguration, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	out := &apiserverv1.AuthenticationConfiguration{}
	for _, file := range files {
		data, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", file, err)
		}
		var config apiserverv1.AuthenticationConfiguration
		if err := yaml.UnmarshalStrict(data, &config); err != nil {
			return nil, fmt.Errorf("decoding %s: %w", file, err)
		}
		for _, a := range config.JWT {
			k := slices.IndexFunc(issuers, func(i *OIDCIssuer) bool { return i.URL == a.Issuer.URL })
			if k < 0 {
				return nil, fmt.Errorf("%s: no test issuer for %s", file, a.Issuer.URL)
			}
			trusted, err := issuers[k].Trust(a)
			if err != nil {
				return nil, err
			}
			out.JWT = append(out.JWT, trusted)
		}
	}
	return out, nil
}
