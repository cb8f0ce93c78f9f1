package owner_test

import (
	"context"
	"errors"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
)

// A seed that races a restore (after its records were checked, before the
// forks are installed) makes the restore fail all or none: the sessions it
// did install are ended, the fork of the raced session is stopped, and the
// seeded session keeps its own sandbox.
func TestRestoreRacedBySeedInstallsNothing(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	for _, sid := range []string{"s1", "s2", "s3"} {
		seed(t, o, sid)
	}
	commit(t, o, "c1")
	for _, sid := range []string{"s1", "s2", "s3"} {
		if err := o.EndSessionSandbox(context.Background(), sid); err != nil {
			t.Fatal(err)
		}
	}
	// The last fork to begin seeds s2 first (the hook runs outside the
	// fake's lock, on the fork's goroutine).
	var mu sync.Mutex
	forks := 0
	var raced sandbox.Sandbox
	var seedErr error
	e.fk.SetHook(func(c fake.Call) {
		if c.Op != fake.OpFork || c.Phase != fake.PhaseBegin {
			return
		}
		mu.Lock()
		forks++
		last := forks == 3
		mu.Unlock()
		if last {
			raced, seedErr = o.StartSessionSandbox(context.Background(), "s2", provider.Spec{}, notesSetup("tok-s2"), "")
		}
	})
	_, err := o.Restore(context.Background(), owner.RestoreRequest{CheckpointID: "c1"})
	e.fk.SetHook(nil)
	if seedErr != nil {
		t.Fatalf("the racing seed: %v", seedErr)
	}
	if !errors.Is(err, owner.ErrRestoreFailed) {
		t.Fatalf("got %v, want ErrRestoreFailed", err)
	}
	ids, err := o.Sessions()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"s2"}, ids); diff != "" {
		t.Fatalf("sessions after the failed restore (-want +got):\n%s", diff)
	}
	live := e.fk.LiveSandboxIDs()
	sort.Strings(live)
	if diff := cmp.Diff([]string{raced.Handle.SandboxID}, live); diff != "" {
		t.Fatalf("live sandboxes after the failed restore (-want +got):\n%s", diff)
	}
	if sb, err := o.RequireSessionSandbox(context.Background(), "s2"); err != nil || sb.Handle.SandboxID != raced.Handle.SandboxID || sb.Restored {
		t.Fatalf("the raced session holds %+v (%v), want its own sandbox %s", sb.Handle, err, raced.Handle.SandboxID)
	}
	// The fork that was never installed is held by nobody.
	if live, _, lost := o.SessionCounts(); live != 1 || lost != 0 {
		t.Errorf("SessionCounts = %d live, %d lost; want the raced seed's sandbox only", live, lost)
	}
}

// A restore writes nothing to the index before its forks (its forks carry
// this incarnation's labels, which is all a crash needs to stop them): the
// index holds no intent but the owner's standing rounds intent while they
// run, and none after.
func TestRestoreWritesNoIntent(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	seed(t, o, "s1")
	commit(t, o, "c1")
	if err := o.EndSessionSandbox(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var during []string
	e.fk.SetHook(func(c fake.Call) {
		if c.Op != fake.OpFork || c.Phase != fake.PhaseBegin {
			return
		}
		ins, err := o.Index().Intents("")
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			during = append(during, err.Error())
		}
		for _, in := range ins {
			if in.Kind != "rounds" || in.ID != o.Incarnation() {
				during = append(during, in.Kind+"/"+in.ID)
			}
		}
	})
	if _, err := o.Restore(context.Background(), owner.RestoreRequest{CheckpointID: "c1"}); err != nil {
		t.Fatal(err)
	}
	e.fk.SetHook(nil)
	after, err := o.Index().Intents("")
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(during) > 0 || !onlyRoundsOf(after, o) {
		t.Errorf("intents during the forks %v, after the restore %v; want none", during, after)
	}
}

// A restore makes each session's actor as its fork returns, while the
// other forks run, unlisted: a session is found only once the install
// lists them all; a restore whose fork fails stops the actors it made,
// which leave their forks to the restore.
func TestRestoreMakesActorsAsForksReturn(t *testing.T) {
	for _, failLast := range []bool{false, true} {
		e := newEnv(t)
		o := e.open(parallelism(1))
		var last sandbox.Sandbox
		for _, sid := range []string{"s1", "s2", "s3"} {
			last = seed(t, o, sid)
		}
		commit(t, o, "c1")
		for _, sid := range []string{"s1", "s2", "s3"} {
			if err := o.EndSessionSandbox(context.Background(), sid); err != nil {
				t.Fatal(err)
			}
		}
		// The ended sessions' actors live out their grace on the test's
		// clock, which stands still.
		graves := owner.Children(o)
		var mu sync.Mutex
		forks := 0
		var during []string
		children := -1
		e.fk.SetHook(func(c fake.Call) {
			if c.Op != fake.OpFork || c.Phase != fake.PhaseBegin {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if forks++; forks == 3 {
				// The actors are made on a goroutine of the restore's own:
				// wait for the two forks' (a bound only a restore that
				// makes none reaches).
				for i := 0; owner.Children(o)-graves < 2 && i < 1000000; i++ {
					runtime.Gosched()
				}
				ids, err := o.Sessions()
				if err != nil {
					t.Error(err)
				}
				during, children = ids, owner.Children(o)-graves
			}
		})
		if failLast {
			// One worker forks the records in order: s3's is the last.
			e.fk.FailNextFor(fake.OpFork, last.Handle.SandboxID, 1)
		}
		_, err := o.Restore(context.Background(), owner.RestoreRequest{CheckpointID: "c1"})
		e.fk.SetHook(nil)
		if len(during) != 0 || children != 2 {
			t.Errorf("fail %v: at the last fork %v listed and %d actors, want none listed and the two forks' actors made", failLast, during, children)
		}
		ids, lerr := o.Sessions()
		if lerr != nil {
			t.Fatal(lerr)
		}
		if !failLast {
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]string{"s1", "s2", "s3"}, ids); diff != "" || owner.Children(o)-graves != 3 {
				t.Errorf("after the restore (-want +got):\n%s%d actors, want 3", diff, owner.Children(o)-graves)
			}
			continue
		}
		if !errors.Is(err, owner.ErrRestoreFailed) || len(ids) != 0 {
			t.Fatalf("restore with its last fork failing: %v, sessions %v; want ErrRestoreFailed and none", err, ids)
		}
		// Each round trip lets the stopped actors' Terminated through; a
		// bound that only a restore leaving its actors running reaches.
		for i := 0; owner.Children(o) != graves; i++ {
			if i == 100000 {
				t.Fatalf("%d actors after the failed restore, want its two stopped", owner.Children(o)-graves)
			}
			if _, err := o.Sessions(); err != nil {
				t.Fatal(err)
			}
		}
		if live := e.fk.LiveSandboxIDs(); len(live) != 0 {
			t.Errorf("live sandboxes after the failed restore: %v", live)
		}
	}
}

// A fork that fails is named with its own error in the restore's: "could
// not be re-created from snapshot", not as a fork whose turn never came.
func TestRestoreNamesAFailedForksError(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	sb := seed(t, o, "s1")
	commit(t, o, "c1")
	if err := o.EndSessionSandbox(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	e.fk.FailNextFor(fake.OpFork, sb.Handle.SandboxID, 1)
	_, err := o.Restore(context.Background(), owner.RestoreRequest{CheckpointID: "c1"})
	if !errors.Is(err, owner.ErrRestoreFailed) || !strings.Contains(err.Error(), "s1: could not be re-created from snapshot") {
		t.Fatalf("restore with s1's fork failing: %v; want ErrRestoreFailed naming s1's own failure", err)
	}
}
