package owner_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxowner/owner/internal/racebuild"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
)

// A seed is refused, and starts nothing, on a server that lends no
// sandboxes and for an empty session id.
func TestStartRefusesWhatItCannotLend(t *testing.T) {
	o, err := owner.New(context.Background(), owner.Config{Name: "grader"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	if _, err := o.StartSessionSandbox(context.Background(), "s1", provider.Spec{}, nil, ""); !errors.Is(err, provider.ErrUnsupported) {
		t.Fatalf("a seed on a server without a provider: %v, want provider.ErrUnsupported", err)
	}
	e := newEnv(t)
	o = e.open()
	if _, err := o.StartSessionSandbox(context.Background(), "", provider.Spec{}, nil, ""); !errors.Is(err, provider.ErrInvalidSpec) {
		t.Fatalf("a seed without a session id: %v, want provider.ErrInvalidSpec", err)
	}
	if st := e.fk.Stats(); st.Started != 0 {
		t.Fatalf("the provider started %d sandboxes, want 0", st.Started)
	}
}

// SessionCounts counts a seed in setup as in setup, and once its setup is
// done as live.
func TestSessionCountsASeedInSetup(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	inSetup, let := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := o.StartSessionSandbox(context.Background(), "s1", provider.Spec{}, func(context.Context, provider.Provider, sandbox.Sandbox) (json.RawMessage, error) {
			close(inSetup)
			<-let
			return nil, nil
		}, "/w")
		done <- err
	}()
	<-inSetup
	if live, setup, lost := o.SessionCounts(); live != 0 || setup != 1 || lost != 0 {
		t.Fatalf("during setup: %d live, %d in setup, %d lost; want 0, 1, 0", live, setup, lost)
	}
	close(let)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if live, setup, lost := o.SessionCounts(); live != 1 || setup != 0 || lost != 0 {
		t.Fatalf("after setup: %d live, %d in setup, %d lost; want 1, 0, 0", live, setup, lost)
	}
}

// A session whose sandbox vanished behind the owner's back (its lease ran
// out) is lost: the call that finds out and every later one say so, and
// it counts as lost until it is ended.
func TestASessionWhoseSandboxVanishedIsLost(t *testing.T) {
	e := newEnv(t)
	o := e.open(func(c *owner.Config) { c.Checkpoint.Enabled = false; c.DefaultTTL = time.Minute })
	if _, err := o.StartSessionSandbox(context.Background(), "s1", provider.Spec{}, nil, "/w"); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(2 * time.Minute)
	if gone := e.fk.Reap(); len(gone) != 1 {
		t.Fatalf("the fake reaped %v, want the session's sandbox", gone)
	}
	do := func() error {
		return o.Do(context.Background(), "s1", func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) error {
			_, err := p.Exec(ctx, sb.Handle, provider.ExecRequest{Command: "true"})
			return err
		})
	}
	if err := do(); !errors.Is(err, sandbox.ErrLost) {
		t.Fatalf("the call that found the sandbox gone: %v, want sandbox.ErrLost", err)
	}
	if err := do(); !errors.Is(err, sandbox.ErrLost) {
		t.Fatalf("a call after the loss: %v, want sandbox.ErrLost", err)
	}
	if _, err := o.RequireSessionSandbox(context.Background(), "s1"); !errors.Is(err, sandbox.ErrLost) {
		t.Fatalf("RequireSessionSandbox of a lost session: %v, want sandbox.ErrLost", err)
	}
	if live, _, lost := o.SessionCounts(); live != 0 || lost != 1 {
		t.Fatalf("%d live, %d lost; want 0, 1", live, lost)
	}
	if err := o.EndSessionSandbox(context.Background(), "s1"); err != nil {
		t.Fatalf("ending a lost session: %v", err)
	}
	if _, err := o.RequireSessionSandbox(context.Background(), "s1"); !errors.Is(err, sandbox.ErrNone) {
		t.Fatalf("RequireSessionSandbox of an ended session: %v, want sandbox.ErrNone", err)
	}
}

// TestADoOnAnIdleSessionSendsNoMessage: an idle session lends its sandbox,
// so a Do runs on an effect worker under the permit its view holds, with
// no message to the session's actor and back (the Do message, its mailbox
// slots, the effect and its completion were ten more allocations and two
// more goroutine hand-offs).
func TestADoOnAnIdleSessionSendsNoMessage(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("allocation counts are not taken under -race")
	}
	e := newEnv(t)
	o := e.open(func(c *owner.Config) { c.Checkpoint.Enabled = false })
	if _, err := o.StartSessionSandbox(context.Background(), "s1", provider.Spec{}, nil, "/w"); err != nil {
		t.Fatal(err)
	}
	noop := func(context.Context, provider.Provider, sandbox.Sandbox) error { return nil }
	if n := testing.AllocsPerRun(100, func() {
		if err := o.Do(context.Background(), "s1", noop); err != nil {
			t.Fatal(err)
		}
	}); n > 4 {
		t.Fatalf("a Do on an idle session allocates %.1f times, want at most 4", n)
	}
}

// TestADoWhoseContextEndedRunsNothing: a Do whose context already ended
// runs nothing, on an idle session's lent permit as through its mailbox:
// the caller hears the context's error and fn never runs. A later Do
// returns only once any run of fn ended (the permit serialises them).
func TestADoWhoseContextEndedRunsNothing(t *testing.T) {
	e := newEnv(t)
	o := e.open(func(c *owner.Config) { c.Checkpoint.Enabled = false })
	if _, err := o.StartSessionSandbox(context.Background(), "s1", provider.Spec{}, nil, "/w"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var ran atomic.Bool
	if err := o.Do(ctx, "s1", func(context.Context, provider.Provider, sandbox.Sandbox) error {
		ran.Store(true)
		return nil
	}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a Do whose context ended: %v, want context.Canceled", err)
	}
	if err := o.Do(context.Background(), "s1", func(context.Context, provider.Provider, sandbox.Sandbox) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if ran.Load() {
		t.Fatal("a Do whose context had ended ran its function")
	}
}
