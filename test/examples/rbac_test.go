package examples

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// decodeObjects reads every Kubernetes object of a multi-document YAML file.
func decodeObjects(t *testing.T, rel string) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(repoFile(t, rel))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var objs []*unstructured.Unstructured
	for {
		obj := &unstructured.Unstructured{}
		err := dec.Decode(&obj.Object)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		if obj.GetAPIVersion() == "" || obj.GetKind() == "" {
			t.Fatalf("%s: an object without apiVersion or kind: %v", rel, obj.Object)
		}
		objs = append(objs, obj)
	}
}

// pipelineClusterRole is config/rbac/pipeline_role.yaml, the ClusterRole
// that the chart creates for pipelines.
func pipelineClusterRole(t *testing.T) *rbacv1.ClusterRole {
	t.Helper()
	objs := decodeObjects(t, "config/rbac/pipeline_role.yaml")
	if len(objs) != 1 || objs[0].GetKind() != "ClusterRole" {
		t.Fatalf("config/rbac/pipeline_role.yaml: want one ClusterRole, got %d objects", len(objs))
	}
	role := &rbacv1.ClusterRole{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(objs[0].Object, role); err != nil {
		t.Fatal(err)
	}
	return role
}

// TestPipelineRoleIsWhatThePluginNeeds: the ClusterRole the examples bind
// lets the plugin create, watch, renew and delete its claims, and never
// write a verdict.
func TestPipelineRoleIsWhatThePluginNeeds(t *testing.T) {
	role := pipelineClusterRole(t)
	var verbs []string
	for _, r := range role.Rules {
		for _, res := range r.Resources {
			if res == "buildlocks/status" || res == "*" {
				t.Errorf("%s grants %v on %s: only the operator writes verdicts", role.Name, r.Verbs, res)
			}
			if res == "buildlocks" && slices.Contains(r.APIGroups, "buildlock.io") {
				verbs = append(verbs, r.Verbs...)
			}
		}
	}
	for _, v := range []string{"create", "get", "list", "watch", "patch", "delete"} {
		if !slices.Contains(verbs, v) {
			t.Errorf("%s does not grant %s on buildlocks, which the plugin needs", role.Name, v)
		}
	}
}

// TestExampleRBAC: every example's rbac.yaml has a ServiceAccount bound to
// the pipeline ClusterRole in its own namespace, and declares no rules of
// its own.
func TestExampleRBAC(t *testing.T) {
	role := pipelineClusterRole(t)
	files, err := filepath.Glob(repoFile(t, "examples/*/rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 4 {
		t.Errorf("found %d examples/*/rbac.yaml, want one per CI system (4)", len(files))
	}
	for _, file := range files {
		rel, _ := filepath.Rel(repoFile(t, "."), file)
		t.Run(rel, func(t *testing.T) {
			accounts, bound := map[string]bool{}, map[string]bool{}
			for _, obj := range decodeObjects(t, rel) {
				switch obj.GetKind() {
				case "ServiceAccount":
					accounts[obj.GetNamespace()+"/"+obj.GetName()] = true
				case "RoleBinding":
					rb := &rbacv1.RoleBinding{}
					if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, rb); err != nil {
						t.Fatal(err)
					}
					if rb.RoleRef.Kind != "ClusterRole" || rb.RoleRef.Name != role.Name {
						t.Errorf("RoleBinding %s binds %s %s, want ClusterRole %s", rb.Name, rb.RoleRef.Kind, rb.RoleRef.Name, role.Name)
					}
					for _, s := range rb.Subjects {
						if s.Kind != "ServiceAccount" || s.Namespace != rb.Namespace {
							t.Errorf("RoleBinding %s binds %s %s/%s, want a ServiceAccount of its namespace %s", rb.Name, s.Kind, s.Namespace, s.Name, rb.Namespace)
						}
						bound[s.Namespace+"/"+s.Name] = true
					}
				default:
					t.Errorf("%s %s: an example binds the chart's ClusterRole and declares nothing else", obj.GetKind(), obj.GetName())
				}
			}
			if len(accounts) == 0 {
				t.Error("no ServiceAccount")
			}
			for sa := range accounts {
				if !bound[sa] {
					t.Errorf("ServiceAccount %s is not bound to %s", sa, role.Name)
				}
			}
		})
	}
}
