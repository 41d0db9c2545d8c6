package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// decodeYAMLFile reads every Kubernetes object of a multi-document YAML file.
func decodeYAMLFile(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(path)
	must(t, err)
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
			t.Fatalf("%s: %v", path, err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		if obj.GetAPIVersion() == "" || obj.GetKind() == "" {
			t.Fatalf("%s: an object without apiVersion or kind: %v", path, obj.Object)
		}
		objs = append(objs, obj)
	}
}

// TestExamples checks that every example parses, and that each example's
// Role grants a pipeline exactly what the plugin needs on BuildLocks, at
// most reading on BuildLockPolicies, and no right on their status.
func TestExamples(t *testing.T) {
	root := filepath.Join("..", "..", "examples")
	wantVerbs := []string{"create", "delete", "get", "list", "patch", "watch"}
	readVerbs := []string{"get", "list", "watch"}
	roles := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		ext := filepath.Ext(path)
		if ext != ".yaml" && ext != ".yml" {
			return nil
		}
		data, err := os.ReadFile(path)
		must(t, err)
		// Every YAML file is valid YAML, document by document.
		for doc := range strings.SplitSeq(string(data), "\n---") {
			var v any
			if err := yaml.Unmarshal([]byte(doc), &v); err != nil {
				t.Errorf("%s: %v", path, err)
			}
		}
		if filepath.Base(filepath.Dir(path)) != "tekton" && filepath.Base(path) != "rbac.yaml" {
			return nil // a CI system's own file (GitHub workflow, GitLab CI)
		}
		for _, obj := range decodeYAMLFile(t, path) {
			if obj.GetKind() != "Role" {
				continue
			}
			roles++
			rules, _, _ := unstructured.NestedSlice(obj.Object, "rules")
			claims := 0
			for _, r := range rules {
				rule := r.(map[string]any)
				groups, _, _ := unstructured.NestedStringSlice(rule, "apiGroups")
				resources, _, _ := unstructured.NestedStringSlice(rule, "resources")
				verbs, _, _ := unstructured.NestedStringSlice(rule, "verbs")
				slices.Sort(verbs)
				switch {
				case slices.Equal(groups, []string{"buildlock.io"}) && slices.Equal(resources, []string{"buildlocks"}) && slices.Equal(verbs, wantVerbs):
					claims++
				case slices.Equal(groups, []string{"buildlock.io"}) && slices.Equal(resources, []string{"buildlockpolicies"}) && isSubset(verbs, readVerbs):
				default:
					t.Errorf("%s: Role %s grants %v %v %v; want buildlock.io buildlocks %v, and at most %v on buildlockpolicies",
						path, obj.GetName(), groups, resources, verbs, wantVerbs, readVerbs)
				}
			}
			if claims != 1 {
				t.Errorf("%s: Role %s has %d rules for buildlocks, want 1", path, obj.GetName(), claims)
			}
		}
		return nil
	})
	must(t, err)
	if roles < 4 {
		t.Errorf("found %d example Roles, want one per CI system (4)", roles)
	}
}

func isSubset(sub, set []string) bool {
	for _, s := range sub {
		if !slices.Contains(set, s) {
			return false
		}
	}
	return true
}
