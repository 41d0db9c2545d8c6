package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/utils/ptr"

	"github.com/buildlock/buildlock/pkg/lock"
)

const oidcTokenLong = `Print this CI job's OIDC ID token as a kubeconfig exec credential
(client.authentication.k8s.io/v1 ExecCredential), for a cluster that trusts the CI
system's tokens (docs/install.md, "Pipelines without cluster secrets"). A kubeconfig
that oidc-kubeconfig writes runs it whenever it needs a token.

With --audience, the token is requested from GitHub Actions for that audience (the
job needs permissions: id-token: write); with --token-env, it is read from that
variable (GitLab: an entry of the job's id_tokens). The token is never printed
anywhere else.

Exit codes: 0 printed, 1 no token (the message says what the job lacks), 2 usage error.`

const oidcTokenExample = `  # The user of a kubeconfig, on GitHub Actions
  users:
  - name: ci
    user:
      exec:
        apiVersion: client.authentication.k8s.io/v1
        command: kubectl-buildlock
        args: [oidc-token, --audience, https://k8s.example.com]
        interactiveMode: Never`

// idTokenFlags choose where the job's ID token comes from.
type idTokenFlags struct {
	audience, tokenEnv string
}

func (t *idTokenFlags) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&t.audience, "audience", "", "GitHub Actions: the audience to request the job's ID token for (the one the cluster trusts).")
	cmd.Flags().StringVar(&t.tokenEnv, "token-env", "", "The environment variable that holds the job's ID token (GitLab: an id_tokens entry).")
}

func (t *idTokenFlags) validate() error {
	switch {
	case t.audience == "" && t.tokenEnv == "":
		return errors.New("say where the ID token comes from: --audience (GitHub Actions) or --token-env (GitLab's id_tokens)")
	case t.audience != "" && t.tokenEnv != "":
		return errors.New("give --audience or --token-env, not both")
	}
	return nil
}

// args are the flags again, for the kubeconfig's exec.
func (t *idTokenFlags) args() []string {
	if t.tokenEnv != "" {
		return []string{"--token-env", t.tokenEnv}
	}
	return []string{"--audience", t.audience}
}

// oidcTokenOptions is `kubectl buildlock oidc-token`.
type oidcTokenOptions struct {
	f     *factory
	token idTokenFlags
}

func newOIDCTokenCommand(o *oidcTokenOptions) *cobra.Command {
	cmd := newCommand(o, "oidc-token (--audience AUD | --token-env VAR)",
		"Print the CI job's OIDC ID token as a kubeconfig exec credential", oidcTokenLong, oidcTokenExample)
	cmd.Args = cobra.NoArgs
	o.token.addFlags(cmd)
	return cmd
}

func (o *oidcTokenOptions) Complete(*cobra.Command, []string) error { return nil }

func (o *oidcTokenOptions) Validate() error { return o.token.validate() }

func (o *oidcTokenOptions) Run(ctx context.Context) error {
	hc := &http.Client{Timeout: 30 * time.Second}
	t, err := lock.FetchIDToken(ctx, o.f.env, lock.IDTokenSource{Audience: o.token.audience, TokenEnv: o.token.tokenEnv}, hc)
	if err != nil {
		return err
	}
	data, err := t.ExecCredential()
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(o.f.streams.Out, "%s\n", data)
	return err
}

const oidcKubeconfigLong = `Print a kubeconfig with which this CI job reaches the cluster at --server with its
CI system's OIDC ID token, instead of a stored secret: its user runs
"kubectl-buildlock oidc-token" (this binary) with the same --audience or --token-env
whenever it needs a token, so kubectl, helm and the plugin renew it as it expires.
The kubeconfig holds no secret; its context names the claims' namespace
(--namespace, required). The cluster must trust the CI system's tokens
(docs/install.md, "Pipelines without cluster secrets").

Exit codes: 0 printed, 1 error, 2 usage error.`

const oidcKubeconfigExample = `  # GitHub Actions (permissions: id-token: write)
  kubectl buildlock oidc-kubeconfig --server https://k8s.example.com:6443 --namespace ci \
    --certificate-authority-data "$CLUSTER_CA" --audience https://k8s.example.com > "$RUNNER_TEMP/kubeconfig"

  # GitLab, with id_tokens: {BUILDLOCK_ID_TOKEN: {aud: https://k8s.example.com}}
  kubectl buildlock oidc-kubeconfig --server https://k8s.example.com:6443 --namespace ci \
    --certificate-authority ca.crt --token-env BUILDLOCK_ID_TOKEN > kubeconfig`

// oidcKubeconfigOptions is `kubectl buildlock oidc-kubeconfig`.
type oidcKubeconfigOptions struct {
	f      *factory
	token  idTokenFlags
	caData string
	// Completed from kubectl's connection flags, which name the cluster.
	cluster lock.OIDCCluster
}

func newOIDCKubeconfigCommand(o *oidcKubeconfigOptions) *cobra.Command {
	cmd := newCommand(o, "oidc-kubeconfig --server URL (--audience AUD | --token-env VAR)",
		"Print a kubeconfig that reaches the cluster with the CI job's OIDC ID token", oidcKubeconfigLong, oidcKubeconfigExample)
	cmd.Args = cobra.NoArgs
	o.token.addFlags(cmd)
	cmd.Flags().StringVar(&o.caData, "certificate-authority-data", "",
		"The cluster's certificate authority, base64-encoded PEM as in a kubeconfig (or --certificate-authority FILE; neither: the system's roots).")
	return cmd
}

func (o *oidcKubeconfigOptions) Complete(*cobra.Command, []string) error {
	k := o.f.kube
	o.cluster.Server = ptr.Deref(k.APIServer, "")
	o.cluster.Namespace = ptr.Deref(k.Namespace, "")
	switch file := ptr.Deref(k.CAFile, ""); {
	case o.caData != "":
		data, err := base64.StdEncoding.DecodeString(o.caData)
		if err != nil {
			return usageErr{fmt.Errorf("--certificate-authority-data is not base64: %w", err)}
		}
		o.cluster.CAData = data
	case file != "":
		data, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("reading --certificate-authority: %w", err)
		}
		o.cluster.CAData = data
	}
	return nil
}

func (o *oidcKubeconfigOptions) Validate() error {
	switch {
	case o.cluster.Server == "":
		return errors.New("--server is required: the URL of the cluster's API server")
	case o.cluster.Namespace == "":
		return errors.New("--namespace is required: the namespace of the claims, where the cluster grants this job buildlock-pipeline " +
			"(the kubeconfig's context names it, so that every command of the job works there)")
	}
	return o.token.validate()
}

func (o *oidcKubeconfigOptions) Run(context.Context) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this binary for the kubeconfig to run: %w", err)
	}
	data, err := lock.OIDCKubeconfig(o.cluster, self, append([]string{"oidc-token"}, o.token.args()...))
	if err != nil {
		return usageErr{err}
	}
	_, err = o.f.streams.Out.Write(data)
	return err
}
