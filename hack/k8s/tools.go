//go:build tools

// Package k8s pins the Kubernetes control-plane binaries that the tests run
// against. setup-envtest cannot download them here, so they are built from the
// Go module proxy instead; see the Makefile's envtest target.
package k8s

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
