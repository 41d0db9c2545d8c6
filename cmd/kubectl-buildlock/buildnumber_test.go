package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/buildlock/buildlock/pkg/lock"
)

var pipelineRunCRD sync.Once

// installPipelineRunCRD installs a stand-in for Tekton's PipelineRun CRD
// (the kind, without its schema), once for the package.
func installPipelineRunCRD(t *testing.T) {
	t.Helper()
	pipelineRunCRD.Do(func() {
		crd := &apiextensionsv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: "pipelineruns.tekton.dev"},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{
				Group: "tekton.dev", Scope: apiextensionsv1.NamespaceScoped,
				Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "pipelineruns", Singular: "pipelinerun", Kind: "PipelineRun", ListKind: "PipelineRunList"},
				Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
					Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
						Type: "object", XPreserveUnknownFields: ptrTo(true)}}}},
			},
		}
		must(t, envtest.CreateCRDs(adminCfg, []*apiextensionsv1.CustomResourceDefinition{crd}))
		must(t, envtest.WaitForCRDs(adminCfg, []*apiextensionsv1.CustomResourceDefinition{crd}, envtest.CRDInstallOptions{MaxTime: time.Minute, PollInterval: 100 * time.Millisecond}))
	})
}

// TestBuildNumberOfAPipelineRun: build-number prints the PipelineRun's
// creation time in seconds, as the API server stamped it, so that a later
// PipelineRun is a newer build; without --pipelinerun it is a usage error,
// and a PipelineRun that does not exist is an error that names it.
func TestBuildNumberOfAPipelineRun(t *testing.T) {
	f := newFixture(t)
	installPipelineRunCRD(t)
	// examples/tekton/rbac-build-number.yaml's Role and RoleBinding, in
	// the test's namespace, for the test's pipeline user.
	ctx := context.Background()
	data, err := os.ReadFile(filepath.Join("..", "..", "examples", "tekton", "rbac-build-number.yaml"))
	must(t, err)
	docs := strings.Split(string(data), "\n---\n")
	if len(docs) != 2 {
		t.Fatalf("examples/tekton/rbac-build-number.yaml has %d objects, want a Role and its RoleBinding", len(docs))
	}
	role, binding := &rbacv1.Role{}, &rbacv1.RoleBinding{}
	must(t, yaml.UnmarshalStrict([]byte(docs[0]), role))
	must(t, yaml.UnmarshalStrict([]byte(docs[1]), binding))
	role.Namespace, binding.Namespace = f.ns, f.ns
	binding.Subjects = []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "ci-pipeline"}}
	must(t, admin.Create(ctx, role))
	must(t, admin.Create(ctx, binding))
	create := func(name string) int64 {
		t.Helper()
		pr := &unstructured.Unstructured{}
		pr.SetGroupVersionKind(lock.PipelineRunGVK)
		pr.SetNamespace(f.ns)
		pr.SetName(name)
		must(t, admin.Create(ctx, pr))
		return pr.GetCreationTimestamp().Unix()
	}
	first := create("shop-deploy-1")
	code, p := f.run(nil, "build-number", "--pipelinerun", "shop-deploy-1")
	if code != exitOK || strings.TrimSpace(p.stdout.String()) != strconv.FormatInt(first, 10) {
		t.Fatalf("build-number exited %d, printed %q, want %d:\n%s", code, p.stdout, first, p.stderr)
	}
	time.Sleep(time.Until(time.Unix(first+1, 0)))
	second := create("shop-deploy-2")
	code, p = f.run(nil, "build-number", "--pipelinerun", "shop-deploy-2")
	if got, _ := strconv.ParseInt(strings.TrimSpace(p.stdout.String()), 10, 64); code != exitOK || got != second || got <= first {
		t.Errorf("the later PipelineRun's build-number exited %d, printed %q, want %d > %d:\n%s", code, p.stdout, second, first, p.stderr)
	}

	if code, p := f.run(nil, "build-number"); code != exitUsage || !strings.Contains(p.stderr.String(), "missing --pipelinerun") {
		t.Errorf("build-number without --pipelinerun exited %d:\n%s", code, p.stderr)
	}
	if code, p := f.run(nil, "build-number", "--pipelinerun", "nope"); code != exitError || !strings.Contains(p.stderr.String(), "PipelineRun "+f.ns+"/nope") {
		t.Errorf("build-number of a missing PipelineRun exited %d:\n%s", code, p.stderr)
	}
}
