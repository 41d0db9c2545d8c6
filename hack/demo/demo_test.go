package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/buildlock/buildlock/internal/testenv"
)

// TestDemo plays `make demo` under `go test`, so that CI runs it with the
// other tests. The narration is shown with -v or when the demo fails, the
// operator's logs only when it fails.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("the demo starts a control plane; skipped with -short")
	}
	// The operator's goroutines may log after the test returns; a buffer
	// (unlike t.Output) does not mind.
	logs := &testenv.SyncBuffer{}
	ctrl.SetLogger(zap.New(zap.WriteTo(logs), zap.UseDevMode(true)))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, &out, 30*time.Second)
	if err != nil || testing.Verbose() {
		t.Log("\n" + out.String())
	}
	if err != nil {
		t.Log("Operator logs:\n" + logs.String())
		t.Fatal(err)
	}
}
