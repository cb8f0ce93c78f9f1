package owner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
)

// Requests find a session's actor in the supervisor's directory instead of
// asking the supervisor, so one made right after an end (or a failed start)
// can still find the actor the supervisor is about to forget. It must get
// "no session sandbox" at once all the same: the forgotten actor answers as
// ended for supervisor.ForgetGrace, and a request queued behind its stop
// after that gets what a dead letter gets (messages.Undelivered), read as
// ended; never a wait to its timeout (the deadline below turns such a wait
// into a failure).
func TestRequestsAfterAnEndSeeNoSessionSandbox(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	noop := func(context.Context, provider.Provider, sandbox.Sandbox) error { return nil }
	failing := func(context.Context, provider.Provider, sandbox.Sandbox) (json.RawMessage, error) {
		return nil, errors.New("setup failed")
	}
	for i := 0; i < 300; i++ {
		sid := fmt.Sprintf("s%d", i)
		if i%3 == 2 {
			if _, err := o.StartSessionSandbox(context.Background(), sid, provider.Spec{}, failing, ""); !errors.Is(err, sandbox.ErrSetup) {
				t.Fatalf("%s: got %v, want sandbox.ErrSetup", sid, err)
			}
		} else {
			seed(t, o, sid)
			if err := o.EndSessionSandbox(context.Background(), sid); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		if err := o.Do(ctx, sid, noop); !errors.Is(err, sandbox.ErrNone) {
			t.Fatalf("%s: Do after the end: %v, want sandbox.ErrNone", sid, err)
		}
		if _, err := o.RequireSessionSandbox(context.Background(), sid); !errors.Is(err, sandbox.ErrNone) {
			t.Fatalf("%s: RequireSessionSandbox after the end: %v", sid, err)
		}
		if err := o.EndSessionSandbox(ctx, sid); err != nil {
			t.Fatalf("%s: a second end: %v", sid, err)
		}
		cancel()
	}
}
