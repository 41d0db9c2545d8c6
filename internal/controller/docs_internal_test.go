package controller

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/buildlock/buildlock/internal/doctest"
)

// TestOperationsSaysWhatIsWatched holds the table "What the manager
// watches" of docs/operations.md to the manager's cache options: each kind
// they configure has a row, which says "metadata only" exactly when the kind
// is cached as metadata, "stripped" when a transform reduces it, and names
// the label selector that limits it; and with the default transform (managed
// fields dropped) the BuildLock row says so.
func TestOperationsSaysWhatIsWatched(t *testing.T) {
	rows, err := doctest.Table("docs/operations.md", "What the manager watches")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]string{}
	for _, row := range rows {
		for _, kind := range strings.Split(row[0], ",") {
			documented[strings.TrimSpace(kind)] = row[1]
		}
	}
	opts := cacheOptions(nil)
	for obj, by := range opts.ByObject {
		gvk, err := apiutil.GVKForObject(obj, Scheme())
		if err != nil {
			t.Fatal(err)
		}
		row, ok := documented[gvk.Kind]
		if !ok {
			t.Errorf("docs/operations.md: the manager caches %ss, and the table of what it watches has no row for them", gvk.Kind)
			continue
		}
		_, metadataOnly := obj.(*metav1.PartialObjectMetadata)
		if says := strings.Contains(row, "metadata only"); says != metadataOnly {
			t.Errorf("docs/operations.md: %s: the row says %q; the manager caches them as metadata only: %t", gvk.Kind, row, metadataOnly)
		}
		if says := strings.Contains(row, "stripped"); says != (by.Transform != nil) {
			t.Errorf("docs/operations.md: %s: the row says %q; the manager strips them with a transform: %t", gvk.Kind, row, by.Transform != nil)
		}
		if by.Label != nil && !strings.Contains(row, "`"+by.Label.String()+"`") {
			t.Errorf("docs/operations.md: %s: the row %q does not name the selector that limits them, `%s`", gvk.Kind, row, by.Label)
		}
		if by.Label == nil && strings.Contains(row, "only buildlock's own") {
			t.Errorf("docs/operations.md: %s: the row says %q, but the manager caches every one", gvk.Kind, row)
		}
	}
	if says := strings.Contains(documented["BuildLock"], "without managed fields"); says != (opts.DefaultTransform != nil) {
		t.Errorf("docs/operations.md: BuildLock: the row says %q; the manager drops managed fields: %t", documented["BuildLock"], opts.DefaultTransform != nil)
	}
}
