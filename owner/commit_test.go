package owner_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
)

// A failed commit's error is what a client reads as the reason: the
// sessions that failed in order, then the cause; it is ErrCommitFailed and
// wraps its cause, and is no other error.
func TestCommitErrorSaysWhatFailed(t *testing.T) {
	cause := errors.New("index closed")
	for _, tc := range []struct {
		failed map[string]string
		err    error
		want   string
	}{
		{nil, nil, `checkpoint "c1" not committed`},
		{map[string]string{"s2": "deadline", "s1": "snapshot refused"}, nil, `checkpoint "c1" not committed; s1: snapshot refused; s2: deadline`},
		{nil, cause, `checkpoint "c1" not committed: index closed`},
		{map[string]string{"s1": "snapshot refused"}, cause, `checkpoint "c1" not committed; s1: snapshot refused: index closed`},
	} {
		err := error(&owner.CommitError{CheckpointID: "c1", Failed: tc.failed, Err: tc.err})
		if got := err.Error(); got != tc.want {
			t.Errorf("message %q, want %q", got, tc.want)
		}
		if !errors.Is(err, owner.ErrCommitFailed) || errors.Is(err, sandbox.ErrNone) {
			t.Errorf("%v: is ErrCommitFailed %t, is ErrNone %t; want only the first", err, errors.Is(err, owner.ErrCommitFailed), errors.Is(err, sandbox.ErrNone))
		}
		if errors.Is(err, cause) != (tc.err != nil) {
			t.Errorf("%v wraps its cause: %t", err, errors.Is(err, cause))
		}
	}
}

// A snapshot that takes until just before the round's deadline (on the
// owner's clock) is still exported: the commit waits for the round as long
// as the round runs.
func TestCommitWaitsForASlowSnapshotUntilTheDeadline(t *testing.T) {
	e := newEnv(t)
	o := e.open(roundTimeout(time.Minute))
	seed(t, o, "s1")
	began, let := make(chan struct{}), make(chan struct{})
	e.fk.SetHook(func(c fake.Call) {
		if c.Op == fake.OpSnapshot && c.Phase == fake.PhaseBegin {
			close(began)
			<-let
		}
	})
	defer e.fk.SetHook(nil)
	done := make(chan error, 1)
	go func() {
		_, err := o.Commit(context.Background(), owner.CommitRequest{CheckpointID: "c1"})
		done <- err
	}()
	<-began
	e.clk.Advance(time.Minute - time.Second)
	close(let)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("a commit whose snapshot ended before the deadline: %v", err)
		}
	case <-time.After(time.Minute): // a guard against a hang, not a wait
		t.Fatal("the commit never returned")
	}
	if _, err := o.Index().Checkpoint("c1"); err != nil {
		t.Fatalf("checkpoint c1: %v", err)
	}
}
