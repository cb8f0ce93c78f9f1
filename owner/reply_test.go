package owner

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/sandboxowner/owner/internal/timeouts"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
)

// guardTimeout only turns a hang into a failure; nothing waits on it.
const guardTimeout = time.Minute

func replyOwner(t *testing.T) *Owner {
	t.Helper()
	o, err := New(context.Background(), Config{Name: "notes", Provider: fake.New(fake.Options{Seed: 1})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	if _, err := o.StartSessionSandbox(context.Background(), "s1", provider.Spec{Image: "notes"}, nil, ""); err != nil {
		t.Fatal(err)
	}
	return o
}

// A request that reaches an actor which has stopped is a dead letter: its
// asker hears so at once (as ErrDeadLetter, which the session API reads as
// "the session is over") instead of waiting out its context.
func TestCallToAStoppedActorIsUndelivered(t *testing.T) {
	o := replyOwner(t)
	pid := o.dir.Lookup("s1")
	if pid == nil {
		t.Fatal("no actor for s1")
	}
	if err := o.system.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), guardTimeout)
	defer cancel()
	_, err := o.ask.do(ctx, pid, func(context.Context, provider.Provider, sandbox.Sandbox) error { return nil })
	if !errors.Is(err, actor.ErrDeadLetter) {
		t.Fatalf("call to a stopped actor: %v, want ErrDeadLetter", err)
	}
	// Its published view went with it: the session holds nothing, as an
	// ask of it would have found.
	if _, err := o.RequireSessionSandbox(ctx, "s1"); !errors.Is(err, sandbox.ErrNone) {
		t.Fatalf("the sandbox of a stopped actor's session: %v, want ErrNone", err)
	}
}

// blockingDo starts a Do whose fn waits for release, and returns once fn
// runs, with the channel its error arrives on.
func blockingDo(t *testing.T, o *Owner, ctx context.Context) (result <-chan error, release func()) {
	t.Helper()
	running, unblock := make(chan struct{}), make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- o.Do(ctx, "s1", func(context.Context, provider.Provider, sandbox.Sandbox) error {
			close(running)
			<-unblock
			return nil
		})
	}()
	<-running
	return errc, func() { close(unblock) }
}

func wait(t *testing.T, errc <-chan error) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(guardTimeout):
		t.Fatal("the call did not return")
		return nil
	}
}

// An asker that gives up leaves its slot behind: the answer that comes later
// must not reach a later request that reused the slot.
func TestAnAbandonedSlotIsNotReused(t *testing.T) {
	o := replyOwner(t)
	ctx, cancel := context.WithCancel(context.Background())
	errc, release := blockingDo(t, o, ctx)
	cancel()
	if err := wait(t, errc); !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned Do: %v, want context.Canceled", err)
	}
	release()
	// This Do queues behind the first: once it is answered, the first's
	// answer has been delivered into its slot.
	if err := o.Do(context.Background(), "s1", func(context.Context, provider.Provider, sandbox.Sandbox) error { return nil }); err != nil {
		t.Fatal(err)
	}
	// Every slot in the free list gets used; a reused abandoned one would
	// hand a later Do the first one's answer (nil) in place of its own.
	for i := 0; i < 2*maxFreeReplies/1024+8; i++ {
		want := fmt.Errorf("call %d", i)
		err := o.Do(context.Background(), "s1", func(context.Context, provider.Provider, sandbox.Sandbox) error { return want })
		if !errors.Is(err, want) {
			t.Fatalf("Do %d answered %v, want its own %v", i, err, want)
		}
	}
	if n := len(o.ask.replies); n == 0 {
		t.Fatal("no slot was recycled: the free list is unused")
	}
}

// A request waiting for its answer returns ErrClosed when the owner goes
// away, without an answer and without a deadline.
func TestAWaitingCallEndsWithTheOwner(t *testing.T) {
	o := replyOwner(t)
	errc, release := blockingDo(t, o, context.Background())
	defer release()
	o.Abandon()
	if err := wait(t, errc); !errors.Is(err, ErrClosed) {
		t.Fatalf("Do across the owner's end: %v, want ErrClosed", err)
	}
}

// TestSupervisorAsksShareOneBound: every ask of the supervisor (two per
// seed and close) is bounded by one shared context that ends between
// timeouts.Reply and twice that from now, not by a context and timer of
// its own; a bound past its deadline reports so.
func TestSupervisorAsksShareOneBound(t *testing.T) {
	o := replyOwner(t)
	before := time.Now()
	a, b := o.ask.bounded(), o.ask.bounded()
	if a != b {
		t.Fatal("two asks got bounds of their own")
	}
	dl, ok := a.Deadline()
	if !ok || dl.Before(before.Add(timeouts.Reply)) || dl.After(time.Now().Add(2*timeouts.Reply)) {
		t.Fatalf("bound's deadline %v (%v), want between %v and twice that from now", dl, ok, timeouts.Reply)
	}
	if err := a.Err(); err != nil {
		t.Fatalf("a live bound: %v", err)
	}
	past := newBound(time.Now())
	select {
	case <-past.Done():
	case <-time.After(guardTimeout): // a guard against a hang, not a wait
		t.Fatal("a bound past its deadline is not done")
	}
	if err := past.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a bound past its deadline: %v, want context.DeadlineExceeded", err)
	}
	if _, err := o.Sessions(); err != nil {
		t.Fatalf("an ask of the supervisor within the bound: %v", err)
	}
}
