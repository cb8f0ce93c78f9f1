package owner_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sort"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
)

// TestStormLeavesIndexAndProviderConsistent races seeds, ends and commits
// (some failing) over 1,000 sessions, then checks that every snapshot the
// index names exists, every snapshot that exists is named or tombstoned, and
// every live sandbox belongs to a live session.
func TestStormLeavesIndexAndProviderConsistent(t *testing.T) {
	const sessions, workers, commits = 1000, 8, 12
	e := newEnv(t)
	// Its wall time follows the machine's load (3.9 s quiet, 101 s at load
	// 30 under -race): the hang guard's bound could end it; go test's
	// -timeout guards it instead.
	e.disarm()
	o := e.open(parallelism(16))
	e.fk.SetLatencyRange(fake.OpSnapshot, 0, 200_000) // up to 0.2 ms, seeded

	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(w)))
			for i := w; i < sessions; i += workers {
				sid := fmt.Sprintf("s%04d", i)
				if _, err := o.StartSessionSandbox(context.Background(), sid, provider.Spec{Image: "notes"}, notesSetup(sid), ""); err != nil {
					t.Errorf("seed %s: %v", sid, err)
					return
				}
				if rng.Intn(3) == 0 {
					if err := o.EndSessionSandbox(context.Background(), sid); err != nil {
						t.Errorf("end %s: %v", sid, err)
					}
				}
			}
		}(w)
	}
	committed := []string{}
	for c := 0; c < commits; c++ {
		id := fmt.Sprintf("c%02d", c)
		switch c % 4 {
		case 1:
			e.fk.FailNext(fake.OpSnapshot, 1)
		case 2:
			e.fk.FailAfterEffect(fake.OpSnapshot, 1)
		}
		_, err := o.Commit(context.Background(), owner.CommitRequest{CheckpointID: id})
		switch {
		case err == nil:
			committed = append(committed, id)
		case errors.Is(err, owner.ErrCommitFailed):
		default:
			t.Fatalf("commit %s: %v", id, err)
		}
		if c%5 == 4 && len(committed) > 0 {
			if _, err := o.Release(context.Background(), committed[len(committed)-1:]); err != nil {
				t.Fatalf("release: %v", err)
			}
		}
	}
	wg.Wait()
	e.fk.ClearFaults()
	if len(committed) == 0 {
		t.Fatal("no commit succeeded in the storm")
	}

	// Every live sandbox is held by a live session.
	ids, err := o.Sessions()
	if err != nil {
		t.Fatal(err)
	}
	var held []string
	for _, sid := range ids {
		if sb, ok := o.SessionSandbox(context.Background(), sid); ok {
			held = append(held, sb.Handle.SandboxID)
		}
	}
	sort.Strings(held)
	if diff := cmp.Diff(held, e.fk.LiveSandboxIDs()); diff != "" {
		t.Fatalf("live sandboxes vs held (-held +live):\n%s", diff)
	}
	checkConsistentOpen(t, e, o)
}
