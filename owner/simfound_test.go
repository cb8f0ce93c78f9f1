package owner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
)

// Regression tests for bugs the simulation (go run ./sim) found; each names
// the seed that found it.

// Seed 284 (step 3): a setup fails and the stop of its sandbox fails once;
// nothing tracks the sandbox, so it ran on, leaked.
func TestFailedSetupStopsItsSandboxDespiteAFailedStop(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	e.fk.FailNext(fake.OpStop, 1)
	failing := func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) (json.RawMessage, error) {
		return nil, errors.New("setup failed")
	}
	if _, err := o.StartSessionSandbox(context.Background(), "s1", provider.Spec{}, failing, ""); !errors.Is(err, sandbox.ErrSetup) {
		t.Fatalf("got %v, want sandbox.ErrSetup", err)
	}
	if got := e.fk.LiveSandboxIDs(); len(got) != 0 {
		t.Fatalf("the sandbox of a failed setup still runs: %v", got)
	}
}

// Seeds 9 (step 22) and 102 (step 8): the fresh owner's sweep of what a
// crashed one left running did not retry a failed stop, so the sandbox ran
// on, held by nobody.
func TestStartupSweepStopsEarlierSandboxesDespiteAFailedStop(t *testing.T) {
	e := newEnv(t)
	o1 := e.open()
	seed(t, o1, "s1")
	o1.Abandon()
	e.fk.FailNext(fake.OpStop, 1)
	e.open()
	if got := e.fk.LiveSandboxIDs(); len(got) != 0 {
		t.Fatalf("the crashed owner's sandboxes still run: %v", got)
	}
}

// Seed 220 (step 23): right after EndSessionSandbox returned, Sessions still
// listed the session (its stop was answered before the supervisor was told to
// forget it), so a commit right after an end could ask the dying actor and
// fail with "session stopped during the checkpoint".
func TestEndedSessionIsForgottenWhenEndReturns(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	seed(t, o, "keep")
	for i := 0; i < 200; i++ {
		sid := fmt.Sprintf("s%d", i)
		seed(t, o, sid)
		if err := o.EndSessionSandbox(context.Background(), sid); err != nil {
			t.Fatal(err)
		}
		ids, err := o.Sessions()
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"keep"}, ids); diff != "" {
			t.Fatalf("round %d: sessions after the end (-want +got):\n%s", i, diff)
		}
		if i%20 == 0 {
			if _, err := o.Commit(context.Background(), owner.CommitRequest{CheckpointID: fmt.Sprintf("c%d", i)}); err != nil {
				t.Fatalf("a commit right after an end: %v", err)
			}
		}
	}
}

// Seed 340 (step 26): a session restored from c1 is live; a second restore of
// c1 (another session) fails with a fork that failed after its effect, and
// its rollback, looking for that fork by label, stopped every fork of c1 this
// owner made: the live session lost its sandbox.
func TestFailedRestoreRollbackSparesForksLiveSessionsHold(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	seed(t, o, "s1")
	seed(t, o, "s2")
	commit(t, o, "c1")
	for _, sid := range []string{"s1", "s2"} {
		if err := o.EndSessionSandbox(context.Background(), sid); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := o.Restore(context.Background(), owner.RestoreRequest{CheckpointID: "c1", Sessions: []string{"s1"}}); err != nil {
		t.Fatal(err)
	}
	held, err := o.RequireSessionSandbox(context.Background(), "s1")
	if err != nil {
		t.Fatal(err)
	}
	e.fk.FailAfterEffect(fake.OpFork, 1)
	if _, err := o.Restore(context.Background(), owner.RestoreRequest{CheckpointID: "c1", Sessions: []string{"s2"}}); !errors.Is(err, owner.ErrRestoreFailed) {
		t.Fatalf("got %v, want ErrRestoreFailed", err)
	}
	if diff := cmp.Diff([]string{held.Handle.SandboxID}, e.fk.LiveSandboxIDs()); diff != "" {
		t.Fatalf("live sandboxes after the failed restore (-want +got):\n%s", diff)
	}
}
