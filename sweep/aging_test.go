package sweep_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/snapshotindex"
	"github.com/sandboxowner/owner/sweep"
)

var t0 = time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)

// TestAgingStep: an id is due once seen unaccounted at an earlier sweep and
// After after its first sighting; a sweep that does not see it forgets it;
// After zero still needs two sightings.
func TestAgingStep(t *testing.T) {
	type step struct {
		at      time.Duration
		ids     []string
		due     []string
		waiting map[string]time.Duration // id -> due, from t0
	}
	for name, c := range map[string]struct {
		after time.Duration
		steps []step
	}{
		"due after the retention": {after: time.Minute, steps: []step{
			{at: 0, ids: []string{"a"}, waiting: map[string]time.Duration{"a": time.Minute}},
			{at: 59 * time.Second, ids: []string{"a", "b"}, waiting: map[string]time.Duration{"a": time.Minute, "b": 119 * time.Second}},
			{at: time.Minute, ids: []string{"a", "b"}, due: []string{"a"}, waiting: map[string]time.Duration{"b": 119 * time.Second}},
		}},
		"a sweep that does not see it starts it again": {after: time.Minute, steps: []step{
			{at: 0, ids: []string{"a"}, waiting: map[string]time.Duration{"a": time.Minute}},
			{at: 30 * time.Second, ids: nil},
			{at: 2 * time.Minute, ids: []string{"a"}, waiting: map[string]time.Duration{"a": 3 * time.Minute}},
		}},
		"zero retention needs an earlier sighting": {after: 0, steps: []step{
			{at: 0, ids: []string{"a"}, waiting: map[string]time.Duration{"a": 0}},
			{at: 0, ids: []string{"a"}, due: []string{"a"}},
		}},
	} {
		t.Run(name, func(t *testing.T) {
			a := &sweep.Aging{After: c.after}
			for i, s := range c.steps {
				due, waiting := a.Step(s.ids, t0.Add(s.at))
				var gotDue []string
				for _, id := range s.ids {
					if due[id] {
						gotDue = append(gotDue, id)
					}
				}
				gotWait := map[string]time.Duration{}
				for id, w := range waiting {
					gotWait[id] = w.Due.Sub(t0)
				}
				wantWait := s.waiting
				if wantWait == nil {
					wantWait = map[string]time.Duration{}
				}
				if diff := cmp.Diff([]any{s.due, wantWait}, []any{gotDue, gotWait}); diff != "" {
					t.Fatalf("step %d (-want +got):\n%s", i, diff)
				}
			}
		})
	}
}

// TestSweepAgingHoldsBackWhatIsNotDue: with an Aging a reap removes only
// what was seen unaccounted for the retention; the rest is reported as
// waiting and left alone.
func TestSweepAgingHoldsBackWhatIsNotDue(t *testing.T) {
	ctx := context.Background()
	fk, dir, wantSbs, wantSnaps := crashed(t)
	idx := open(t, dir)
	aging := &sweep.Aging{After: time.Minute}
	opts := sweep.Options{Owner: "notes", Provider: fk, Index: idx, Aging: aging, Now: t0, Reap: true}
	rep, err := sweep.Run(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	want := []sweep.Waiting{
		{Kind: sweep.KindSandbox, ID: wantSbs[0], Since: t0, Due: t0.Add(time.Minute)},
		{Kind: sweep.KindSnapshot, ID: wantSnaps[0], Since: t0, Due: t0.Add(time.Minute)},
	}
	if diff := cmp.Diff(want, rep.Waiting); diff != "" || len(rep.Stopped)+len(rep.Deleted) != 0 {
		t.Fatalf("waiting (-want +got):\n%s\nremoved %v %v", diff, rep.Stopped, rep.Deleted)
	}
	opts.Now = t0.Add(time.Minute)
	if rep, err = sweep.Run(ctx, opts); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([2][]string{wantSbs, wantSnaps}, [2][]string{rep.Stopped, rep.Deleted}); diff != "" || len(rep.Waiting) != 0 {
		t.Fatalf("removed once due (-want +got):\n%s\nwaiting %v", diff, rep.Waiting)
	}
}

// TestSweepKeepsWhatTheSessionsHold: a sandbox labelled with a session the
// server tracks, one a session holds and a snapshot a session needs are
// kept; an error reading them deletes nothing.
func TestSweepKeepsWhatTheSessionsHold(t *testing.T) {
	ctx := context.Background()
	fk, dir, wantSbs, wantSnaps := crashed(t)
	idx := open(t, dir)
	seeding, err := fk.Start(ctx, provider.Spec{Image: "notes", Metadata: map[string]string{owner.LabelOwner: "notes", owner.LabelSession: "s9"}})
	if err != nil {
		t.Fatal(err)
	}
	held := sweep.Held{Sessions: map[string]bool{"s9": true}, Sandboxes: map[string]bool{wantSbs[0]: true}, Snapshots: map[string]bool{wantSnaps[0]: true}}
	rep, err := sweep.Run(ctx, sweep.Options{Owner: "notes", Provider: fk, Index: idx, Held: func() (sweep.Held, error) { return held, nil }, Reap: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Stopped)+len(rep.Deleted) != 0 || rep.KeptSandboxes != 4 || rep.KeptSnapshots != 3 {
		t.Fatalf("removed what the sessions hold: %+v (seeding %s)", rep, seeding.SandboxID)
	}
	boom := errors.New("boom")
	before := fk.Stats()
	if _, err := sweep.Run(ctx, sweep.Options{Owner: "notes", Provider: fk, Index: idx, Held: func() (sweep.Held, error) { return sweep.Held{}, boom }, Reap: true}); !errors.Is(err, boom) {
		t.Fatalf("got %v, want the error reading what is held", err)
	}
	if after := fk.Stats(); after.Calls[fake.OpStop] != before.Calls[fake.OpStop] || after.Calls[fake.OpDeleteSnapshot] != before.Calls[fake.OpDeleteSnapshot] {
		t.Fatal("a sweep that could not read what is held removed something")
	}
}

// TestSweepLeavesSnapshotsInUse: a snapshot the provider refuses as in use
// is reported in use, not failed.
func TestSweepLeavesSnapshotsInUse(t *testing.T) {
	fk, dir, _, wantSnaps := crashed(t)
	// A sandbox not of the owner's stands on the snapshot.
	if _, err := fk.Fork(context.Background(), provider.Spec{Image: "someone-else"}, wantSnaps[0]); err != nil {
		t.Fatal(err)
	}
	rep, err := sweep.Run(context.Background(), sweep.Options{Owner: "notes", Provider: fk, Index: open(t, dir), Reap: true})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantSnaps, rep.InUse); diff != "" || len(rep.Deleted) != 0 {
		t.Fatalf("in use (-want +got):\n%s\ndeleted %v", diff, rep.Deleted)
	}
}

// TestRetryPending: a tombstone younger than After waits, one a live fork
// needs is deferred, one the provider refuses as in use is deferred and
// kept, one whose delete fails is kept; a deleted one's tombstone is
// cleared, and a later retry deletes what was deferred once it is free.
func TestRetryPending(t *testing.T) {
	ctx := context.Background()
	fk := fake.New(fake.Options{Seed: 1})
	h, err := fk.Start(ctx, provider.Spec{Image: "notes"})
	if err != nil {
		t.Fatal(err)
	}
	snaps := map[string]string{}
	for _, name := range []string{"young", "needed", "refused", "failing", "free"} {
		if snaps[name], err = fk.Snapshot(ctx, h, name); err != nil {
			t.Fatal(err)
		}
	}
	idx := open(t, t.TempDir())
	var ts []snapshotindex.Tombstone
	for name, id := range snaps {
		at := t0
		if name == "young" {
			at = t0.Add(50 * time.Second)
		}
		ts = append(ts, snapshotindex.Tombstone{SnapshotID: id, Provider: fk.Name(), Reason: name, At: at})
	}
	if err := idx.AddTombstones(ts); err != nil {
		t.Fatal(err)
	}
	fk.FailNextFor(fake.OpDeleteSnapshot, snaps["failing"], 1)
	fork, err := fk.Fork(ctx, provider.Spec{Image: "someone-else"}, snaps["refused"])
	if err != nil {
		t.Fatal(err)
	}
	opts := sweep.PendingOptions{Provider: fk, Index: idx, After: time.Minute, Now: t0.Add(time.Minute), InUse: map[string]bool{snaps["needed"]: true}}
	rep, err := sweep.RetryPending(ctx, opts)
	if err == nil {
		t.Fatal("a failed delete was not an error")
	}
	want := sweep.PendingReport{
		Pending:  5,
		Waiting:  []sweep.Waiting{{Kind: sweep.KindPendingDelete, ID: snaps["young"], Since: t0.Add(50 * time.Second), Due: t0.Add(110 * time.Second)}},
		Deferred: sorted(snaps["needed"], snaps["refused"]),
		Deleted:  []string{snaps["free"]},
	}
	got := rep
	got.Failed = nil
	if diff := cmp.Diff(want, got); diff != "" || rep.Failed[snaps["failing"]] == "" {
		t.Fatalf("retry (-want +got):\n%s\nfailed %v", diff, rep.Failed)
	}
	left, err := idx.Tombstones()
	if err != nil || len(left) != 4 {
		t.Fatalf("tombstones left %v, %v: want all but the deleted one's", left, err)
	}
	// The forks are gone: everything old enough goes.
	opts.InUse = nil
	if err := fk.Stop(ctx, fork); err != nil {
		t.Fatal(err)
	}
	opts.Now = t0.Add(2 * time.Minute)
	if rep, err = sweep.RetryPending(ctx, opts); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sorted(snaps["young"], snaps["needed"], snaps["refused"], snaps["failing"]), rep.Deleted); diff != "" {
		t.Fatalf("second retry deleted (-want +got):\n%s", diff)
	}
	if left, err := idx.Tombstones(); err != nil || len(left) != 0 {
		t.Fatalf("tombstones left %v, %v", left, err)
	}
}

func sorted(ids ...string) []string {
	out := append([]string(nil), ids...)
	slices.Sort(out)
	return out
}
