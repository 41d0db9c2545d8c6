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

// The directories of config/ that installations apply: the identity
// admission policies, which every installation has (config/default, the
// chart's identity.enabled, New's environments); the fence (and the probe's
// RBAC), which the chart's enforcement.enabled adds; and the policy that
// keeps the API server's Lease parameter informer alive, which comes with
// the fence and stays when it goes.
const (
	IdentityDir      = "identity"
	EnforcementDir   = "enforcement"
	LeaseInformerDir = "lease-informer"
)

// InstallIdentity installs config/identity (what every installation has),
// and waits until the API server applies its mutating policies: requests
// are then admitted as in a default installation. Objects that exist
// already are left as they are.
func InstallIdentity(ctx context.Context, cfg *rest.Config) error {
	return install(ctx, cfg, IdentityDir)
}

// InstallEnforcement installs config/identity, config/enforcement and
// config/lease-informer (what the chart installs with enforcement.enabled),
// and waits until the API server applies the mutating policies: requests
// are then admitted as in a cluster that enforces locks. Objects that exist
// already are left as they are.
func InstallEnforcement(ctx context.Context, cfg *rest.Config) error {
	return install(ctx, cfg, IdentityDir, EnforcementDir, LeaseInformerDir)
}

// install creates the objects of dirs of config/ (IdentityDir among them)
// and waits until the mutating policies stamp claims.
func install(ctx context.Context, cfg *rest.Config, dirs ...string) error {
	c, err := client.New(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		return fmt.Errorf("creating a client: %w", err)
	}
	objs, err := ConfigObjects(dirs...)
	if err != nil {
		return err
	}
	for _, obj := range objs {
		if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
	}
	return WaitForStamps(ctx, c)
}

// WaitForStamps waits until the API server stamps a new claim's
// spec.requester and the authors of its force-release and override.
//
// The API server compiles a mutating policy against the CRD's schema some
// time after both exist; until then it refuses BuildLocks, or admits them
// unstamped before the policies are in effect at all, and the validating
// policies may take effect first. So it waits until a dry run of a create
// is admitted with spec.requester and both stamps.
func WaitForStamps(ctx context.Context, c client.Client) error {
	probe := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{
		"target": "probe", "repo": "buildlock/probe", "branch": "main", "build": int64(1),
	}}}
	probe.SetAPIVersion("buildlock.io/v1alpha1")
	probe.SetKind("BuildLock")
	probe.SetNamespace("default")
	probe.SetName("enforcement-probe")
	probe.SetAnnotations(map[string]string{"buildlock.io/force-release": "probe: installing", "buildlock.io/override": "probe: installing"})
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		admitted := probe.DeepCopy()
		if last = c.Create(ctx, admitted, client.DryRunAll); last != nil {
			return false, nil
		}
		_, stamped, _ := unstructured.NestedString(admitted.Object, "spec", "requester", "username")
		stamps := admitted.GetAnnotations()
		return stamped && stamps["buildlock.io/force-released-by"] != "" && stamps["buildlock.io/overridden-by"] != "", nil
	})
	if err != nil && last != nil {
		return fmt.Errorf("waiting for the admission policies to stamp claims: %w (last answer: %w)", err, last)
	}
	if err != nil {
		return fmt.Errorf("waiting for the admission policies to stamp claims: %w", err)
	}
	return nil
}

// DeleteConfig deletes the objects of the given directories of config/ (as
// `kubectl delete -k` would) and waits until they are gone.
func DeleteConfig(ctx context.Context, cfg *rest.Config, dirs ...string) error {
	c, err := client.New(cfg, client.Options{Scheme: Scheme()})
	if err != nil {
		return fmt.Errorf("creating a client: %w", err)
	}
	objs, err := ConfigObjects(dirs...)
	if err != nil {
		return err
	}
	for _, obj := range objs {
		if err := c.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting %s %s: %w", obj.GetKind(), obj.GetName(), err)
		}
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		for _, obj := range objs {
			if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj.DeepCopy()); !apierrors.IsNotFound(err) {
				return false, nil
			}
		}
		return true, nil
	})
}

// ConfigObjects decodes the objects of every *.yaml file in the given
// directories of config/.
func ConfigObjects(dirs ...string) ([]*unstructured.Unstructured, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	var objs []*unstructured.Unstructured
	for _, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(root, "config", dir, "*.yaml"))
		if err != nil {
			return nil, fmt.Errorf("listing config/%s: %w", dir, err)
		}
		if len(files) == 0 {
			return nil, fmt.Errorf("no manifests in %s", filepath.Join(root, "config", dir))
		}
		for _, file := range files {
			decoded, err := decodeFile(file)
			if err != nil {
				return nil, err
			}
			objs = append(objs, decoded...)
		}
	}
	return objs, nil
}

// decodeFile decodes every object of a multi-document YAML file.
func decodeFile(file string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", file, err)
	}
	var objs []*unstructured.Unstructured
	decoder := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := decoder.Decode(&obj.Object); errors.Is(err, io.EOF) {
			return objs, nil
		} else if err != nil {
			return nil, fmt.Errorf("decoding %s: %w", file, err)
		}
		if len(obj.Object) > 0 {
			objs = append(objs, obj)
		}
	}
}
