//go:build tools

// Package etcd pins the etcd server that the tests' kube-apiserver stores its
// data in. It is built from the Go module proxy; see the Makefile's envtest
// target.
package etcd

import _ "go.etcd.io/etcd/server/v3"
