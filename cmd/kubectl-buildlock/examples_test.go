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
	"k8s.io/apimachinery/pkg/runtime"
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

func runtimeConvert(u map[string]any, into any) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructured(u, into)
}

// TestExamples checks that every example parses, and that each example's
// Role grants a pipeline exactly what the plugin needs on BuildLocks and no
// right on their status.
func TestExamples(t *testing.T) {
	root := filepath.Join("..", "..", "examples")
	wantVerbs := []string{"create", "delete", "get", "list", "patch", "watch"}
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
			if len(rules) != 1 {
				t.Errorf("%s: Role %s has %d rules, want 1", path, obj.GetName(), len(rules))
				continue
			}
			rule := rules[0].(map[string]any)
			groups, _, _ := unstructured.NestedStringSlice(rule, "apiGroups")
			resources, _, _ := unstructured.NestedStringSlice(rule, "resources")
			verbs, _, _ := unstructured.NestedStringSlice(rule, "verbs")
			slices.Sort(verbs)
			if !slices.Equal(groups, []string{"buildlock.io"}) || !slices.Equal(resources, []string{"buildlocks"}) || !slices.Equal(verbs, wantVerbs) {
				t.Errorf("%s: Role %s grants %v %v %v, want buildlock.io buildlocks %v", path, obj.GetName(), groups, resources, verbs, wantVerbs)
			}
		}
		return nil
	})
	must(t, err)
	if roles < 4 {
		t.Errorf("found %d example Roles, want one per CI system (4)", roles)
	}
}
