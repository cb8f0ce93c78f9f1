package logs_test

import (
	"context"
	"testing"

	"github.com/sirupsen/logrus/hooks/test"

	"github.com/sandboxowner/owner/internal/logs"
)

func TestRequestIDThroughTheContext(t *testing.T) {
	lg, hook := test.NewNullLogger()
	bare := context.Background()
	if id := logs.RequestIDOf(bare); id != "" {
		t.Errorf("a context of no request: id %q", id)
	}
	if ctx := logs.WithRequestID(bare, ""); ctx != bare {
		t.Error("an empty id changed the context")
	}
	ctx := logs.WithRequestID(bare, "r-1")
	if id := logs.RequestIDOf(ctx); id != "r-1" {
		t.Errorf("RequestIDOf = %q, want r-1", id)
	}
	logs.ForRequest(ctx, lg).Info("caused")
	logs.ForRequest(bare, lg).Info("uncaused")
	entries := hook.AllEntries()
	if len(entries) != 2 {
		t.Fatalf("%d lines, want 2", len(entries))
	}
	if got := entries[0].Data; len(got) != 1 || got[logs.RequestID] != "r-1" {
		t.Errorf("a line of the request: %v, want request_id r-1 only", got)
	}
	if got := entries[1].Data; len(got) != 0 {
		t.Errorf("a line of no request: %v, want no fields", got)
	}
}
