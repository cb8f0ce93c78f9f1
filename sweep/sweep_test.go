package sweep_test

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/records"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/snapshotindex"
	"github.com/sandboxowner/owner/sweep"
)

// crashed builds the state a crashed server leaves: sessions s1 and s2 in
// checkpoint c1, s3 seeded after it, a snapshot of an unfinished commit, and
// a sandbox of somebody else. It returns the fake, the state dir and the
// ids a sweep must report.
func crashed(t *testing.T) (*fake.Provider, string, []string, []string) {
	t.Helper()
	ctx := context.Background()
	o, fk, dir := newOwner(t)
	var held []sandbox.Sandbox
	for _, sid := range []string{"s1", "s2", "s3"} {
		if sid == "s3" {
			if _, err := o.Commit(ctx, owner.CommitRequest{CheckpointID: "c1"}); err != nil {
				t.Fatal(err)
			}
		}
		sb, err := o.StartSessionSandbox(ctx, sid, provider.Spec{Image: "notes"}, noSetup, "")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, sb)
	}
	// A snapshot of the owner's that nothing names (a commit that died
	// before its intent was written, say).
	stray, err := fk.Snapshot(ctx, held[2].Handle, "ng-s3-1-deadbeef")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fk.Start(ctx, provider.Spec{Image: "someone-else"}); err != nil {
		t.Fatal(err)
	}
	o.Abandon()
	return fk, dir, []string{held[2].Handle.SandboxID}, []string{stray}
}

// newOwner is owner "notes" with checkpoints on, over a fake on a manual
// clock, and its state directory.
func newOwner(t *testing.T) (*owner.Owner, *fake.Provider, string) {
	t.Helper()
	clk := clock.NewManual(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))
	fk := fake.New(fake.Options{Clock: clk, Seed: 1})
	dir := t.TempDir()
	o, err := owner.New(context.Background(), owner.Config{Name: "notes", Provider: fk, Clock: clk,
		Checkpoint: owner.CheckpointConfig{Enabled: true, StateDir: dir}})
	if err != nil {
		t.Fatal(err)
	}
	return o, fk, dir
}

// noSetup is a session sandbox's setup that does nothing.
func noSetup(context.Context, provider.Provider, sandbox.Sandbox) (json.RawMessage, error) {
	return nil, nil
}

func open(t *testing.T, dir string) *snapshotindex.Index {
	t.Helper()
	idx, err := snapshotindex.Open(dir, snapshotindex.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = idx.Close() })
	return idx
}

func ids(rep sweep.Report) ([]string, []string) {
	var sbs, snaps []string
	for _, s := range rep.Sandboxes {
		sbs = append(sbs, s.Handle.SandboxID)
	}
	for _, s := range rep.Snapshots {
		snaps = append(snaps, s.ID)
	}
	return sbs, snaps
}

func TestSweepReportsThenReapsWhatNothingAccountsFor(t *testing.T) {
	fk, dir, wantSbs, wantSnaps := crashed(t)
	idx := open(t, dir)
	ctx := context.Background()
	opts := sweep.Options{Owner: "notes", Provider: fk, Index: idx}

	before := fk.Stats()
	rep, err := sweep.Run(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	sbs, snaps := ids(rep)
	if diff := cmp.Diff([2][]string{wantSbs, wantSnaps}, [2][]string{sbs, snaps}); diff != "" {
		t.Fatalf("unaccounted (-want +got):\n%s", diff)
	}
	// s1 and s2's sandboxes are named by c1, so are their snapshots.
	if rep.KeptSandboxes != 2 || rep.KeptSnapshots != 2 || rep.Foreign != 1 {
		t.Fatalf("kept %d sandboxes, %d snapshots, %d foreign", rep.KeptSandboxes, rep.KeptSnapshots, rep.Foreign)
	}
	after := fk.Stats()
	if after.Calls[fake.OpStop] != before.Calls[fake.OpStop] || after.Calls[fake.OpDeleteSnapshot] != before.Calls[fake.OpDeleteSnapshot] {
		t.Fatal("a sweep without -reap removed something")
	}

	opts.Reap = true
	rep, err = sweep.Run(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([2][]string{wantSbs, wantSnaps}, [2][]string{rep.Stopped, rep.Deleted}); diff != "" {
		t.Fatalf("reaped (-want +got):\n%s", diff)
	}
	rep, err = sweep.Run(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if sbs, snaps := ids(rep); len(sbs)+len(snaps) != 0 {
		t.Fatalf("a second sweep still found %v %v", sbs, snaps)
	}
	if got := len(fk.LiveSandboxIDs()); got != 3 { // c1's two, and the foreign one
		t.Fatalf("%d sandboxes left, want 3", got)
	}
}

func TestSweepFailsClosed(t *testing.T) {
	ctx := context.Background()
	for name, prepare := range map[string]func(fk *fake.Provider, idx *snapshotindex.Index){
		"index unreadable": func(_ *fake.Provider, idx *snapshotindex.Index) { _ = idx.Close() },
		"listing fails":    func(fk *fake.Provider, _ *snapshotindex.Index) { fk.FailNext(fake.OpList, 1) },
	} {
		t.Run(name, func(t *testing.T) {
			fk, dir, _, _ := crashed(t)
			idx := open(t, dir)
			prepare(fk, idx)
			before := fk.Stats()
			_, err := sweep.Run(ctx, sweep.Options{Owner: "notes", Provider: fk, Index: idx, Reap: true})
			if !errors.Is(err, sweep.ErrIndexUnreadable) && !errors.Is(err, sweep.ErrCannotList) {
				t.Fatalf("got %v, want a refusal", err)
			}
			after := fk.Stats()
			if after.Calls[fake.OpStop] != before.Calls[fake.OpStop] || after.Calls[fake.OpDeleteSnapshot] != before.Calls[fake.OpDeleteSnapshot] {
				t.Fatal("a refused sweep removed something")
			}
		})
	}
}

func TestSweepReportsFailedRemovals(t *testing.T) {
	fk, dir, wantSbs, _ := crashed(t)
	idx := open(t, dir)
	fk.FailNextFor(fake.OpStop, wantSbs[0], 1)
	rep, err := sweep.Run(context.Background(), sweep.Options{Owner: "notes", Provider: fk, Index: idx, Reap: true})
	if err == nil || len(rep.Failed) != 1 || rep.Failed[wantSbs[0]] == "" {
		t.Fatalf("failed %v, err %v", rep.Failed, err)
	}
	if want := "sweep: 1 of 2 removals failed"; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	if len(rep.Deleted) != 1 {
		t.Fatalf("the snapshot was not deleted: %+v", rep)
	}
}

// With Retained instead of the index, exactly the snapshots and sandboxes
// the records name are kept, and the index is not read.
func TestSweepKeepsExactlyWhatRetainedNames(t *testing.T) {
	fk, _, wantSbs, _ := crashed(t)
	snaps := fk.SnapshotIDs()
	if len(snaps) != 3 {
		t.Fatalf("snapshots %v", snaps)
	}
	keep := snaps[0]
	var heldSbs []string
	for _, id := range fk.LiveSandboxIDs() {
		if info, _ := fk.Sandbox(id); info.Metadata[owner.LabelOwner] == "notes" && id != wantSbs[0] {
			heldSbs = append(heldSbs, id)
		}
	}
	retained := &records.Retained{Snapshots: map[string]bool{keep: true}, Sandboxes: map[string]bool{}}
	for _, id := range heldSbs {
		retained.Sandboxes[id] = true
	}
	rep, err := sweep.Run(context.Background(), sweep.Options{Owner: "notes", Provider: fk, Retained: retained, Reap: true})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([2][]string{wantSbs, snaps[1:]}, [2][]string{rep.Stopped, rep.Deleted}); diff != "" {
		t.Fatalf("reaped (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{keep}, fk.SnapshotIDs()); diff != "" {
		t.Fatalf("snapshots left (-want +got):\n%s", diff)
	}
}

// listerless is a provider that cannot list.
type listerless struct{ provider.Provider }

func (l listerless) Capabilities() provider.Capabilities {
	c := l.Provider.Capabilities()
	c.Lister = nil
	return c
}

// TestSweepRefusesWithoutWhatItNeeds: no owner name, no index, a provider
// that cannot list, a snapshot listing that fails: each refuses before
// anything is removed.
func TestSweepRefusesWithoutWhatItNeeds(t *testing.T) {
	ctx := context.Background()
	fk, dir, _, _ := crashed(t)
	idx := open(t, dir)
	if _, err := sweep.Run(ctx, sweep.Options{Provider: fk, Index: idx, Reap: true}); err == nil {
		t.Error("a sweep without an owner name ran")
	}
	if _, err := sweep.Run(ctx, sweep.Options{Owner: "notes", Provider: fk, Reap: true}); !errors.Is(err, sweep.ErrIndexUnreadable) {
		t.Errorf("a sweep without an index: %v", err)
	}
	if _, err := sweep.Run(ctx, sweep.Options{Owner: "notes", Provider: listerless{fk}, Index: idx, Reap: true}); !errors.Is(err, sweep.ErrCannotList) {
		t.Errorf("a sweep of a provider that cannot list: %v", err)
	}
	lists := 0
	fk.SetHook(func(c fake.Call) {
		if c.Op == fake.OpList && c.Phase == fake.PhaseEnd {
			if lists++; lists == 1 { // the sandbox listing went through: fail the snapshot listing
				fk.FailNext(fake.OpList, 1)
			}
		}
	})
	before := fk.Stats()
	if _, err := sweep.Run(ctx, sweep.Options{Owner: "notes", Provider: fk, Index: idx, Reap: true}); !errors.Is(err, sweep.ErrCannotList) {
		t.Errorf("a sweep whose snapshot listing failed: %v", err)
	}
	if after := fk.Stats(); after.Calls[fake.OpStop] != before.Calls[fake.OpStop] {
		t.Error("a refused sweep stopped a sandbox")
	}
}

// TestSweepKeepsLiveSandboxesAndSortsWhatItReports: a sandbox a live
// session holds is kept; the unaccounted are reported and removed sorted by
// id; a provider that cannot delete snapshots fails a reap that would.
func TestSweepKeepsLiveSandboxesAndSortsWhatItReports(t *testing.T) {
	ctx := context.Background()
	fk, dir, wantSbs, wantSnaps := crashed(t)
	idx := open(t, dir)
	labelled := provider.Spec{Image: "notes", Metadata: map[string]string{owner.LabelOwner: "notes"}}
	for range 2 {
		h, err := fk.Start(ctx, labelled)
		if err != nil {
			t.Fatal(err)
		}
		wantSbs = append(wantSbs, h.SandboxID)
		snap, err := fk.Snapshot(ctx, h, "stray")
		if err != nil {
			t.Fatal(err)
		}
		wantSnaps = append(wantSnaps, snap)
	}
	live := wantSbs[0]
	wantSbs = wantSbs[1:]
	sort.Strings(wantSbs)
	sort.Strings(wantSnaps)
	rep, err := sweep.Run(ctx, sweep.Options{Owner: "notes", Provider: fk, Index: idx, Live: map[string]bool{live: true}})
	if err != nil {
		t.Fatal(err)
	}
	sbs, snaps := ids(rep)
	if diff := cmp.Diff([2][]string{wantSbs, wantSnaps}, [2][]string{sbs, snaps}); diff != "" || rep.KeptSandboxes != 3 {
		t.Fatalf("unaccounted (-want +got):\n%s\nkept %d sandboxes, want 3", diff, rep.KeptSandboxes)
	}
	if _, err := sweep.Run(ctx, sweep.Options{Owner: "notes", Provider: nosnap{fk}, Index: idx, Reap: true}); err == nil {
		t.Error("a reap of snapshots on a provider that cannot delete them succeeded")
	}
	rep, err = sweep.Run(ctx, sweep.Options{Owner: "notes", Provider: fk, Index: idx, Live: map[string]bool{live: true}, Reap: true, Parallelism: 1})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([2][]string{wantSbs, wantSnaps}, [2][]string{rep.Stopped, rep.Deleted}); diff != "" {
		t.Fatalf("reaped (-want +got):\n%s", diff)
	}
}

// nosnap lists but cannot snapshot.
type nosnap struct{ *fake.Provider }

func (n nosnap) Capabilities() provider.Capabilities {
	c := n.Provider.Capabilities()
	c.Snapshotter = nil
	return c
}

// TestReapStopsSandboxesBeforeDeletingSnapshots: a server refuses to delete
// a snapshot while a sandbox forked from it lives, so the reap stops every
// sandbox before it deletes a snapshot.
func TestReapStopsSandboxesBeforeDeletingSnapshots(t *testing.T) {
	fk, dir, _, _ := crashed(t)
	var mu sync.Mutex
	var order []fake.Op
	fk.SetHook(func(c fake.Call) {
		if c.Phase == fake.PhaseBegin && (c.Op == fake.OpStop || c.Op == fake.OpDeleteSnapshot) {
			mu.Lock()
			order = append(order, c.Op)
			mu.Unlock()
		}
	})
	if _, err := sweep.Run(context.Background(), sweep.Options{Owner: "notes", Provider: fk, Index: open(t, dir), Reap: true}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]fake.Op{fake.OpStop, fake.OpDeleteSnapshot}, order); diff != "" {
		t.Fatalf("reap's calls in order (-want +got):\n%s", diff)
	}
}

// TestSweepCountsForeignSnapshots: a snapshot of somebody else's sandbox is
// counted as foreign and never removed; a provider that cannot delete
// snapshots reaps sandboxes when no snapshot needs deleting.
func TestSweepCountsForeignSnapshots(t *testing.T) {
	ctx := context.Background()
	fk, dir, wantSbs, wantSnaps := crashed(t)
	idx := open(t, dir)
	var foreign string
	for _, id := range fk.LiveSandboxIDs() {
		if info, _ := fk.Sandbox(id); info.Metadata[owner.LabelOwner] == "" {
			foreign = id
		}
	}
	if _, err := fk.Snapshot(ctx, provider.Handle{SandboxID: foreign, Provider: fk.Name()}, "theirs"); err != nil {
		t.Fatal(err)
	}
	rep, err := sweep.Run(ctx, sweep.Options{Owner: "notes", Provider: fk, Index: idx})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Foreign != 2 {
		t.Errorf("foreign %d, want the other owner's sandbox and its snapshot", rep.Foreign)
	}
	if err := fk.DeleteSnapshot(ctx, wantSnaps[0]); err != nil {
		t.Fatal(err)
	}
	rep, err = sweep.Run(ctx, sweep.Options{Owner: "notes", Provider: nosnap{fk}, Index: idx, Reap: true})
	if err != nil || !cmp.Equal(rep.Stopped, wantSbs) {
		t.Errorf("a reap with no snapshot to delete on a provider that cannot: stopped %v, %v", rep.Stopped, err)
	}
}

// A template the index records is accounted for, after a crash as before:
// the sweep keeps its snapshot though no session or checkpoint names it.
func TestSweepKeepsRecordedTemplates(t *testing.T) {
	ctx := context.Background()
	o, fk, dir := newOwner(t)
	sb, err := o.StartKeyedSessionSandbox(ctx, "s1", "task-1", provider.Spec{Image: "swe"}, noSetup, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := o.EndSessionSandbox(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	o.Abandon()
	rep, err := sweep.Run(ctx, sweep.Options{Owner: "notes", Provider: fk, Index: open(t, dir), Reap: true})
	if err != nil {
		t.Fatal(err)
	}
	if sbs, snaps := ids(rep); len(sbs)+len(snaps) != 0 || rep.KeptSnapshots != 1 {
		t.Fatalf("found %v %v, kept %d snapshots; want the template kept", sbs, snaps, rep.KeptSnapshots)
	}
	if _, ok := fk.SnapshotInfo(sb.FromSnapshot); !ok {
		t.Fatal("the template's snapshot is gone")
	}
}

// aheadSweeper is a fake that also made ahead, outside its listings, what
// a server which died left (as the local provider's directories).
type aheadSweeper struct {
	*fake.Provider
	left  []string
	err   error
	calls int
}

func (a *aheadSweeper) SweepMadeAhead() ([]string, error) {
	a.calls++
	removed := a.left
	a.left = nil
	return removed, a.err
}

// A sweep with Reap has the provider remove what a server which died made
// ahead, and reports it (a failure among the removals); without Reap it
// asks nothing.
func TestSweepRemovesWhatWasMadeAhead(t *testing.T) {
	fk, dir, _, _ := crashed(t)
	idx := open(t, dir)
	a := &aheadSweeper{Provider: fk, left: []string{"sb-1", "sb-2"}}
	if _, err := sweep.Run(context.Background(), sweep.Options{Owner: "notes", Provider: a, Index: idx}); err != nil || a.calls != 0 {
		t.Fatalf("a sweep that only reports: %v, %d calls to remove what was made ahead", err, a.calls)
	}
	rep, err := sweep.Run(context.Background(), sweep.Options{Owner: "notes", Provider: a, Index: idx, Reap: true})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"sb-1", "sb-2"}, rep.MadeAhead); d != "" {
		t.Errorf("made ahead, removed (-want +got):\n%s", d)
	}
	a.err = errors.New("umount: busy")
	rep, err = sweep.Run(context.Background(), sweep.Options{Owner: "notes", Provider: a, Index: idx, Reap: true})
	// The stray sandbox and snapshot went at the sweep before.
	if err == nil || err.Error() != "sweep: 1 of 1 removals failed" || rep.Failed["made ahead"] != "umount: busy" {
		t.Errorf("a failed removal of what was made ahead: %v, failed %v", err, rep.Failed)
	}
}
