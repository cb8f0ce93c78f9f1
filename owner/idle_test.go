package owner_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
)

// TestRenewLoopEndsIdleSessions: the owner's own ticker, on the injected
// clock, ends a session nobody used for IdleTimeout.
func TestRenewLoopEndsIdleSessions(t *testing.T) {
	e := newEnv(t)
	stopped := make(chan string, 1)
	e.fk.SetHook(func(c fake.Call) {
		if c.Op == fake.OpStop && c.Phase == fake.PhaseEnd {
			stopped <- c.SandboxID
		}
	})
	o := e.open(func(c *owner.Config) {
		c.Checkpoint.Enabled = false
		c.RenewEvery = time.Minute
		c.IdleTimeout = time.Hour
	})
	sb, err := o.StartSessionSandbox(context.Background(), "s1", provider.Spec{}, nil, "/w")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 61; i++ {
		e.clk.WaitPending(1, nil) // the loop waits on its timer
		e.clk.Advance(time.Minute)
	}
	select {
	case id := <-stopped:
		if id != sb.Handle.SandboxID {
			t.Fatalf("stopped %s, want the idle session's %s", id, sb.Handle.SandboxID)
		}
	case <-time.After(time.Minute): // a guard against a hang, not a wait
		t.Fatal("the idle session was not ended")
	}
}

// TestMaxSessionsBoundsStarts: a start past MaxSessions is
// sandbox.ErrAtCapacity and starts nothing.
func TestMaxSessionsBoundsStarts(t *testing.T) {
	e := newEnv(t)
	o := e.open(func(c *owner.Config) { c.Checkpoint.Enabled = false; c.MaxSessions = 2 })
	for _, id := range []string{"s1", "s2"} {
		if _, err := o.StartSessionSandbox(context.Background(), id, provider.Spec{}, nil, "/w"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := o.StartSessionSandbox(context.Background(), "s3", provider.Spec{}, nil, "/w"); !errors.Is(err, sandbox.ErrAtCapacity) {
		t.Fatalf("third start: %v, want ErrAtCapacity", err)
	}
	if st := e.fk.Stats(); st.Started != 2 {
		t.Fatalf("provider started %d sandboxes, want 2", st.Started)
	}
	if err := o.EndSessionSandbox(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := o.StartSessionSandbox(context.Background(), "s3", provider.Spec{}, nil, "/w"); err != nil {
		t.Fatalf("a start once a place is free: %v", err)
	}
}

// TestReapIdleWaitsOutACommit: an idle end racing a commit would fail it, so
// a reap while one runs ends nothing; the next one does.
func TestReapIdleWaitsOutACommit(t *testing.T) {
	e := newEnv(t)
	o := e.open(func(c *owner.Config) { c.IdleTimeout = time.Hour })
	if _, err := o.StartSessionSandbox(context.Background(), "s1", provider.Spec{}, nil, "/w"); err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	e.fk.SetHook(func(c fake.Call) {
		if c.Op == fake.OpSnapshot && c.Phase == fake.PhaseBegin {
			close(entered)
			<-release
		}
	})
	committed := make(chan error, 1)
	go func() {
		_, err := o.Commit(context.Background(), owner.CommitRequest{CheckpointID: "ck1"})
		committed <- err
	}()
	<-entered
	later := e.clk.Now().Add(2 * time.Hour)
	if ended, err := o.ReapIdle(context.Background(), later); err != nil || len(ended) != 0 {
		t.Fatalf("reap during a commit: %v, %v; want nothing ended", ended, err)
	}
	close(release)
	if err := <-committed; err != nil {
		t.Fatalf("commit: %v", err)
	}
	e.fk.SetHook(nil)
	if ended, err := o.ReapIdle(context.Background(), later); err != nil || len(ended) != 1 {
		t.Fatalf("reap after the commit: %v, %v; want s1", ended, err)
	}
}

// TestTouchDefersTheIdleEnd: a session touched since the idle bound is
// kept; once the bound passes its last touch, it is ended.
func TestTouchDefersTheIdleEnd(t *testing.T) {
	e := newEnv(t)
	o := e.open(func(c *owner.Config) { c.Checkpoint.Enabled = false; c.IdleTimeout = time.Hour })
	if _, err := o.StartSessionSandbox(context.Background(), "s1", provider.Spec{}, nil, "/w"); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(50 * time.Minute)
	o.Touch("s1")
	o.Touch("nobody") // a session the owner does not hold is ignored
	if ended, err := o.ReapIdle(context.Background(), e.clk.Now().Add(20*time.Minute)); err != nil || len(ended) != 0 {
		t.Fatalf("reap 70 minutes after the start, 20 after the touch: %v, %v; want nothing ended", ended, err)
	}
	ended, err := o.ReapIdle(context.Background(), e.clk.Now().Add(61*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"s1"}, ended); d != "" {
		t.Fatalf("reap 61 minutes after the touch (-want +got):\n%s", d)
	}
}

// TestTouchSendsNothing: Touch is on every request's path, so it records
// the use where the session's actor reads it instead of sending the actor
// a message (which allocates the message and its mailbox slot).
func TestTouchSendsNothing(t *testing.T) {
	e := newEnv(t)
	o := e.open(func(c *owner.Config) { c.Checkpoint.Enabled = false; c.IdleTimeout = time.Hour })
	if _, err := o.StartSessionSandbox(context.Background(), "s1", provider.Spec{}, nil, "/w"); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { o.Touch("s1") }); n != 0 {
		t.Fatalf("a touch allocates %.1f times, want 0", n)
	}
}

// TestReapIdleEndsWhatWaitedTheTimeout: a reap ends exactly the sessions
// whose last use (their start, or a Touch) is IdleTimeout or more before
// its time, says so in a warning, and forgets them.
func TestReapIdleEndsWhatWaitedTheTimeout(t *testing.T) {
	e := newEnv(t)
	o := e.open(func(c *owner.Config) { c.Checkpoint.Enabled = false; c.IdleTimeout = time.Hour })
	t0 := e.clk.Now()
	sbs := map[string]sandbox.Sandbox{}
	for _, id := range []string{"s1", "s2"} {
		sb, err := o.StartSessionSandbox(context.Background(), id, provider.Spec{}, nil, "/w")
		if err != nil {
			t.Fatal(err)
		}
		sbs[id] = sb
	}
	e.clk.Advance(30 * time.Minute)
	o.Touch("s2")
	reap := func(at time.Duration) []string {
		t.Helper()
		ended, err := o.ReapIdle(context.Background(), t0.Add(at))
		if err != nil {
			t.Fatalf("reap at t0+%v: %v", at, err)
		}
		return ended
	}
	if ended := reap(time.Hour - time.Second); len(ended) != 0 {
		t.Fatalf("a reap before the idle timeout ended %v", ended)
	}
	if d := cmp.Diff([]string{"s1"}, reap(time.Hour)); d != "" {
		t.Fatalf("ended at t0+1h: the session unused since t0, not the one touched at t0+30m (-want +got):\n%s", d)
	}
	if ids, _ := o.Sessions(); !cmp.Equal([]string{"s2"}, ids) {
		t.Fatalf("sessions after the reap: %v, want [s2]", ids)
	}
	// A request right after the reap finds no session at once, never the
	// actor on its way out (where it would wait out its context).
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := o.Do(ctx, "s1", func(context.Context, provider.Provider, sandbox.Sandbox) error { return nil }); !errors.Is(err, sandbox.ErrNone) {
		t.Fatalf("Do after the reap: %v, want sandbox.ErrNone", err)
	}
	if live, _, _ := o.SessionCounts(); live != 1 {
		t.Fatalf("%d sessions hold a sandbox after the reap, want 1", live)
	}
	if d := cmp.Diff([]string{sbs["s2"].Handle.SandboxID}, e.fk.LiveSandboxIDs()); d != "" {
		t.Fatalf("live sandboxes (-want +got):\n%s", d)
	}
	if n := warnings(e.hook, "session ended: no request for the idle timeout"); n != 1 {
		t.Fatalf("%d warnings of an idle end, want 1", n)
	}
	if d := cmp.Diff([]string{"s2"}, reap(90*time.Minute)); d != "" {
		t.Fatalf("ended at t0+90m (-want +got):\n%s", d)
	}
}

// TestReapIdleRetriesAFailedStop: an idle session whose stop fails is not
// reported ended, stays, is warned of, and the next reap ends it.
func TestReapIdleRetriesAFailedStop(t *testing.T) {
	e := newEnv(t)
	o := e.open(func(c *owner.Config) { c.Checkpoint.Enabled = false; c.IdleTimeout = time.Hour })
	sb, err := o.StartSessionSandbox(context.Background(), "s1", provider.Spec{}, nil, "/w")
	if err != nil {
		t.Fatal(err)
	}
	later := e.clk.Now().Add(2 * time.Hour)
	e.fk.FailNextFor(fake.OpStop, sb.Handle.SandboxID, 1)
	if ended, err := o.ReapIdle(context.Background(), later); err != nil || len(ended) != 0 {
		t.Fatalf("a reap whose stop failed: %v, %v; want nothing ended", ended, err)
	}
	if n := warnings(e.hook, "could not end an idle session; the next tick retries"); n != 1 {
		t.Fatalf("%d warnings of a failed idle end, want 1", n)
	}
	if _, err := o.RequireSessionSandbox(context.Background(), "s1"); err != nil {
		t.Fatalf("a failed idle stop dropped the session: %v", err)
	}
	if ended, err := o.ReapIdle(context.Background(), later); err != nil || !cmp.Equal([]string{"s1"}, ended) {
		t.Fatalf("the next reap: %v, %v; want [s1]", ended, err)
	}
}

// TestReapIdleWithoutATimeoutEndsNothing: IdleTimeout 0 never ends a
// session, however long unused.
func TestReapIdleWithoutATimeoutEndsNothing(t *testing.T) {
	e := newEnv(t)
	o := e.open(func(c *owner.Config) { c.Checkpoint.Enabled = false })
	if _, err := o.StartSessionSandbox(context.Background(), "s1", provider.Spec{}, nil, "/w"); err != nil {
		t.Fatal(err)
	}
	if ended, err := o.ReapIdle(context.Background(), e.clk.Now().Add(1000*time.Hour)); err != nil || len(ended) != 0 {
		t.Fatalf("reap without an idle timeout: %v, %v; want nothing ended", ended, err)
	}
}
