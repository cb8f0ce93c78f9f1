package http_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/resources"
	"github.com/sandboxowner/owner/resources/notes"
)

// ctxTool is notes with two tools that hand the test their request's
// context: /keep returns at once, /hold waits for its context to end.
type ctxTool struct {
	*notes.Server
	got chan context.Context
}

func (c ctxTool) Tools() map[string]resources.ToolFunc {
	tools := c.Server.Tools()
	tools["/keep"] = func(ctx context.Context, _ *resources.Session, _ []byte) (any, error) {
		c.got <- ctx
		return map[string]bool{"ok": true}, nil
	}
	tools["/hold"] = func(ctx context.Context, _ *resources.Session, _ []byte) (any, error) {
		c.got <- ctx
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return tools
}

// waitDone waits for ctx to end, failing the test past a generous bound.
func waitDone(t *testing.T, ctx context.Context, what string) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: the request's context did not end", what)
	}
}

// TestRequestContext: a data request's context carries its request id and
// ends once the request is answered; a request still running when a
// shutdown gives up waiting for it has its context ended.
func TestRequestContext(t *testing.T) {
	tools := ctxTool{notes.New(notes.Options{}), make(chan context.Context, 1)}
	h := newHarness(t, withResources(tools))
	a := &agent{}
	h.ok(h.post(a, "/seed_session", map[string]any{}), "seed")
	h.ok(h.do(a, "POST", "/keep", map[string]any{}, map[string]string{httpapi.HeaderRequestID: "keep-1"}), "keep")
	kept := <-tools.got
	waitDone(t, kept, "answered")
	if diff := cmp.Diff("keep-1", logs.RequestIDOf(kept)); diff != "" {
		t.Errorf("the request id its context carries (-want +got):\n%s", diff)
	}

	answered := make(chan struct{})
	go func() {
		defer close(answered)
		h.do(a, "POST", "/hold", map[string]any{}, nil)
	}()
	held := <-tools.got
	if held.Err() != nil {
		t.Fatalf("a running request's context ended before any shutdown: %v", held.Err())
	}
	expired, cancel := context.WithCancel(context.Background())
	cancel()
	if err := h.srv.Shutdown(expired); !errors.Is(err, context.Canceled) {
		t.Errorf("Shutdown with an ended context and a request running: %v, want it to give up", err)
	}
	waitDone(t, held, "shut down")
	<-answered
}
