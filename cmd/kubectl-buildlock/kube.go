package main

import (
	"flag"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	buildlockv1 "github.com/buildlock/buildlock/api/v1alpha1"
)

// kubeFlags are the flags every command takes to reach the cluster.
type kubeFlags struct {
	kubeconfig string
	context    string
	namespace  string
}

func (k *kubeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&k.kubeconfig, "kubeconfig", "", "Path to the kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else the in-cluster config).")
	fs.StringVar(&k.context, "context", "", "The kubeconfig context to use (default: its current context).")
	fs.StringVar(&k.namespace, "namespace", "", "The namespace of the BuildLocks: the pipeline's namespace (default: the context's namespace, or the pod's when in a cluster).")
	fs.StringVar(&k.namespace, "n", "", "Short for --namespace.")
}

// kubeClient is a connection to the cluster.
type kubeClient struct {
	client.WithWatch
	// Namespace is the namespace commands work in.
	Namespace string
}

// scheme knows the built-in kinds (events, SelfSubjectReview) and BuildLock.
func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(buildlockv1.AddToScheme(s))
	return s
}

// connect loads the configuration as kubectl does: --kubeconfig, else
// $KUBECONFIG, else ~/.kube/config, else the in-cluster service account; the
// namespace from --namespace, else the context, else the pod's own.
func connect(k kubeFlags) (*kubeClient, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = k.kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: k.context}
	overrides.Context.Namespace = k.namespace
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the kubeconfig: %w", err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, fmt.Errorf("finding the namespace: %w", err)
	}
	cfg.UserAgent = "kubectl-buildlock"
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme()})
	if err != nil {
		return nil, fmt.Errorf("creating the API client: %w", err)
	}
	return &kubeClient{WithWatch: c, Namespace: ns}, nil
}
