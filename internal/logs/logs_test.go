package logs_test

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/internal/racebuild"
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

// TestRequestContextKeepsTheBoxedID: an id already in an interface value
// is carried as WithRequestID carries a string, without boxing it again
// (the context is the one allocation); "" and a value that is no string
// carry none; the context ends with its Cancel.
func TestRequestContextKeepsTheBoxedID(t *testing.T) {
	bare := context.Background()
	for _, v := range []any{nil, "", 7} {
		if got := logs.RequestIDOf(logs.RequestContext(bare, v)); got != "" {
			t.Errorf("id %#v carried as %q", v, got)
		}
	}
	id := any("r-2")
	ctx := logs.RequestContext(bare, id)
	if got := logs.RequestIDOf(ctx); got != "r-2" {
		t.Errorf("RequestIDOf = %q, want r-2", got)
	}
	ctx.Cancel()
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Errorf("err = %v after Cancel", ctx.Err())
	}
	if racebuild.Enabled {
		return // allocation counts differ under -race
	}
	if n := testing.AllocsPerRun(100, func() { ctx = logs.RequestContext(bare, id) }); n != 1 {
		t.Errorf("%v allocations, want 1 (the context)", n)
	}
}

// TestOrFallsBackToDiscard: a component given no logger logs nowhere; one
// given a logger keeps it.
func TestOrFallsBackToDiscard(t *testing.T) {
	lg, _ := test.NewNullLogger()
	if got := logs.Or(lg); got != lg {
		t.Errorf("Or(logger) = %v, want the logger itself", got)
	}
	d, ok := logs.Or(nil).(*logrus.Logger)
	if !ok || d.Out != io.Discard {
		t.Errorf("Or(nil) = %#v, want a logger writing to io.Discard", logs.Or(nil))
	}
}
