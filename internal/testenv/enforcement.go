package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// InstallEnforcement installs the admission policies of config/enforcement
// (the ones the chart installs with enforcement.enabled): requests are then
// admitted as in a cluster that enforces locks.
func InstallEnforcement(ctx context.Context, cfg *rest.Config) error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		return fmt.Errorf("creating a client: %w", err)
	}
	files, err := filepath.Glob(filepath.Join(root, "config", "enforcement", "*.yaml"))
	if err != nil {
		return fmt.Errorf("listing config/enforcement: %w", err)
	}
	if len(files) == 0 {
		return fmt.Errorf("no admission policies in %s", filepath.Join(root, "config", "enforcement"))
	}
	for _, file := range files {
		if err := applyFile(ctx, c, file); err != nil {
			return err
		}
	}
	// The API server compiles a mutating policy against the CRD's schema
	// some time after both exist; until then it refuses BuildLocks, or
	// admits them unstamped before the policies are in effect at all, and
	// the validating policies may take effect first. Wait until a dry run of
	// a create is admitted with spec.requester stamped.
	probe := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{
		"target": "probe", "repo": "buildlock/probe", "branch": "main", "build": int64(1),
	}}}
	probe.SetAPIVersion("buildlock.io/v1alpha1")
	probe.SetKind("BuildLock")
	probe.SetNamespace("default")
	probe.SetName("enforcement-probe")
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		admitted := probe.DeepCopy()
		if err := c.Create(ctx, admitted, client.DryRunAll); err != nil {
			return false, nil
		}
		_, stamped, _ := unstructured.NestedString(admitted.Object, "spec", "requester", "username")
		return stamped, nil
	})
}

// applyFile creates every object of a multi-document YAML file; objects
// that exist already are left as they are.
func applyFile(ctx context.Context, c client.Client, file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("reading %s: %w", file, err)
	}
	decoder := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var obj unstructured.Unstructured
		if err := decoder.Decode(&obj.Object); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("decoding %s: %w", file, err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		if err := c.Create(ctx, &obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %s %s from %s: %w", obj.GetKind(), obj.GetName(), file, err)
		}
	}
}
