package sweep_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/snapshotindex"
	"github.com/sandboxowner/owner/sweep"
)

// TestLoopPassesOfARunningServer: a running server's loop, pass by pass on
// its clock: what it holds back until due, what it removes, a removal that
// fails (the pass's error, counted, retried by the next pass), a pending
// delete retried, a template dropped only once unused for its retention;
// Status adds the totals up and the passes are logged.
func TestLoopPassesOfARunningServer(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	fk := fake.New(fake.Options{Clock: clk, Seed: 1})
	o, err := owner.New(ctx, owner.Config{Name: "notes", Provider: fk, Clock: clk,
		Checkpoint: owner.CheckpointConfig{Enabled: true, StateDir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	setup := func(context.Context, provider.Provider, sandbox.Sandbox) (json.RawMessage, error) { return nil, nil }
	if _, err := o.StartKeyedSessionSandbox(ctx, "s1", "task-1", provider.Spec{Image: "notes"}, setup, "/w"); err != nil {
		t.Fatal(err)
	}
	if err := o.EndSessionSandbox(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	// A sandbox and its snapshot of the server's that nothing accounts for,
	// and a snapshot whose delete is pending.
	stray, err := fk.Start(ctx, provider.Spec{Image: "notes", Metadata: map[string]string{owner.LabelOwner: "notes"}})
	if err != nil {
		t.Fatal(err)
	}
	straySnap, err := fk.Snapshot(ctx, stray, "stray")
	if err != nil {
		t.Fatal(err)
	}
	pending, err := fk.Snapshot(ctx, stray, "pending")
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Index().AddTombstones([]snapshotindex.Tombstone{{SnapshotID: pending, Provider: fk.Name(), Reason: "release", At: t0}}); err != nil {
		t.Fatal(err)
	}
	log, hook := logtest.NewNullLogger()
	var passes []sweep.Pass
	l := sweep.NewLoop(sweep.LoopConfig{Owner: "notes", Provider: fk, Index: o.Index(), Quiet: o.Quiet, ExpireTemplates: o.ExpireTemplates,
		Clock: clk, Interval: time.Minute, Retention: sweep.Retention{Orphans: 10 * time.Minute, PendingDeletes: 5 * time.Minute, Templates: time.Hour},
		Log: log, OnPass: func(p sweep.Pass) { passes = append(passes, p) }})
	messages := func() []string {
		var out []string
		for _, e := range hook.AllEntries() {
			out = append(out, e.Level.String()+": "+e.Message)
		}
		hook.Reset()
		return out
	}

	// First pass: the strays are seen, the pending delete is not old
	// enough, the template was used just now.
	p := l.Once(ctx)
	if p.Err != nil || !p.At.Equal(t0) || len(passes) != 1 {
		t.Fatalf("first pass at %v: %v (%d passes told)", p.At, p.Err, len(passes))
	}
	want := sweep.Status{Interval: time.Minute, Retention: sweep.Retention{Orphans: 10 * time.Minute, PendingDeletes: 5 * time.Minute, Templates: time.Hour},
		Runs: map[string]uint64{sweep.OutcomeOK: 1, sweep.OutcomeError: 0}, LastRun: t0,
		Kinds: map[string]sweep.KindStatus{
			sweep.KindSandbox:       {Found: 1, Waiting: 1},
			sweep.KindSnapshot:      {Found: 1, Waiting: 1},
			sweep.KindPendingDelete: {Found: 1, Waiting: 1},
			sweep.KindTemplate:      {Waiting: 1},
		}}
	if d := cmp.Diff(want, l.Status()); d != "" {
		t.Fatalf("after the first pass (-want +got):\n%s", d)
	}
	if m := messages(); len(m) != 0 {
		t.Fatalf("a pass that removed nothing logged %q", m)
	}

	// Due: the stray sandbox's stop fails, its snapshot and the pending
	// delete go.
	clk.Advance(10 * time.Minute)
	fk.FailNextFor(fake.OpStop, stray.SandboxID, 1)
	p = l.Once(ctx)
	if p.Err == nil {
		t.Fatal("a pass whose stop failed succeeded")
	}
	want.Runs[sweep.OutcomeError], want.LastRun, want.LastError = 1, t0.Add(10*time.Minute), p.Err.Error()
	want.Kinds = map[string]sweep.KindStatus{
		sweep.KindSandbox:       {Found: 1, Failed: 1, FailedTotal: 1},
		sweep.KindSnapshot:      {Found: 1, Removed: 1, RemovedTotal: 1},
		sweep.KindPendingDelete: {Found: 1, Removed: 1, RemovedTotal: 1},
		sweep.KindTemplate:      {Waiting: 1},
	}
	if d := cmp.Diff(want, l.Status()); d != "" {
		t.Fatalf("after the failed stop (-want +got):\n%s", d)
	}
	wantLog := []string{
		"info: sweep: deleted a snapshot nothing accounted for",
		"info: sweep: deleted a snapshot whose delete was pending",
		"warning: sweep: the pass failed in part; the next one retries",
	}
	if d := cmp.Diff(wantLog, messages()); d != "" {
		t.Fatalf("logged (-want +got):\n%s", d)
	}

	// Past the templates' retention: the sandbox is stopped now, and the
	// template dropped with its snapshot.
	clk.Advance(time.Hour)
	if p = l.Once(ctx); p.Err != nil || len(p.Templates.Dropped) != 1 || len(p.Templates.Deleted) != 1 {
		t.Fatalf("third pass: %+v", p)
	}
	want.Runs[sweep.OutcomeOK], want.LastRun, want.LastError = 2, t0.Add(70*time.Minute), ""
	want.Kinds = map[string]sweep.KindStatus{
		sweep.KindSandbox:       {Found: 1, Removed: 1, RemovedTotal: 1, FailedTotal: 1},
		sweep.KindSnapshot:      {RemovedTotal: 1},
		sweep.KindPendingDelete: {RemovedTotal: 1},
		sweep.KindTemplate:      {Found: 1, Removed: 1, RemovedTotal: 1},
	}
	if d := cmp.Diff(want, l.Status()); d != "" {
		t.Fatalf("after the third pass (-want +got):\n%s", d)
	}
	wantLog = []string{
		"info: sweep: stopped a sandbox nothing accounted for",
		"info: sweep: dropped a template unused for its retention",
	}
	if d := cmp.Diff(wantLog, messages()); d != "" {
		t.Fatalf("logged (-want +got):\n%s", d)
	}
	if _, ok := fk.Sandbox(stray.SandboxID); ok {
		t.Error("the stray sandbox is still there")
	}
	for _, id := range []string{straySnap, pending} {
		if _, ok := fk.SnapshotInfo(id); ok {
			t.Errorf("snapshot %s is still there", id)
		}
	}
	if len(passes) != 3 {
		t.Errorf("%d passes told, want 3", len(passes))
	}
}

// TestLoopWithoutListingOrHoldings: a provider that cannot list still has
// its pending deletes retried; what the sessions hold unreadable fails the
// pass before any delete.
func TestLoopWithoutListingOrHoldings(t *testing.T) {
	ctx := context.Background()
	fk := fake.New(fake.Options{Seed: 1})
	h, err := fk.Start(ctx, provider.Spec{Image: "notes", Metadata: map[string]string{owner.LabelOwner: "notes"}})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := fk.Snapshot(ctx, h, "pending")
	if err != nil {
		t.Fatal(err)
	}
	idx := open(t, t.TempDir())
	if err := idx.AddTombstones([]snapshotindex.Tombstone{{SnapshotID: snap, Provider: fk.Name(), Reason: "release", At: t0}}); err != nil {
		t.Fatal(err)
	}
	var held error
	quiet := func(ctx context.Context, fn func(holdings func() (sweep.Held, error)) error) error {
		return fn(func() (sweep.Held, error) { return sweep.Held{}, held })
	}
	clk := clock.NewManual(t0)
	held = errors.New("sessions unreadable")
	l := sweep.NewLoop(sweep.LoopConfig{Owner: "notes", Provider: listerless{fk}, Index: idx, Quiet: quiet, Clock: clk})
	if p := l.Once(ctx); !errors.Is(p.Err, held) || p.Pending.Pending != 0 {
		t.Fatalf("holdings unreadable: %+v", p)
	}
	if _, ok := fk.SnapshotInfo(snap); !ok {
		t.Fatal("a pass that could not read the holdings deleted a snapshot")
	}
	held = nil
	p := l.Once(ctx)
	if p.Err != nil || len(p.Orphans.Sandboxes) != 0 || !cmp.Equal([]string{snap}, p.Pending.Deleted) {
		t.Fatalf("a provider that cannot list: %+v", p)
	}
	if _, ok := fk.Sandbox(h.SandboxID); !ok {
		t.Fatal("a provider that cannot list had a sandbox stopped")
	}
}

// TestLoopRunsOnItsClock: Run passes every Interval on the clock until its
// context ends; with no interval it returns at once and never passes.
func TestLoopRunsOnItsClock(t *testing.T) {
	fk := fake.New(fake.Options{Seed: 1})
	idx := open(t, t.TempDir())
	quiet := func(ctx context.Context, fn func(holdings func() (sweep.Held, error)) error) error {
		return fn(func() (sweep.Held, error) { return sweep.Held{}, nil })
	}
	clk := clock.NewManual(t0)
	passes := make(chan sweep.Pass, 2)
	cfg := sweep.LoopConfig{Owner: "notes", Provider: fk, Index: idx, Quiet: quiet, Clock: clk, Interval: time.Minute,
		Log: logrus.New(), OnPass: func(p sweep.Pass) { passes <- p }}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); sweep.NewLoop(cfg).Run(ctx) }()
	for i := 1; i <= 2; i++ {
		if !clk.WaitPending(1, done) {
			t.Fatal("Run returned before its context ended")
		}
		clk.Advance(time.Minute)
		p := within(t, passes)
		if at := t0.Add(time.Duration(i) * time.Minute); !p.At.Equal(at) {
			t.Fatalf("pass %d at %v, want %v", i, p.At, at)
		}
	}
	cancel()
	within(t, done)

	cfg.Interval = 0
	done = make(chan struct{})
	go func() { defer close(done); sweep.NewLoop(cfg).Run(context.Background()) }()
	within(t, done)
	clk.Advance(time.Hour)
	select {
	case p := <-passes:
		t.Fatalf("a loop without an interval passed at %v", p.At)
	default:
	}
}

// within receives from ch, failing the test if nothing comes in 30 s (a
// guard against a hang, never a timing the test depends on).
func within[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatal("nothing came in 30 s")
		panic("unreachable")
	}
}

// failingClear is an index whose tombstones cannot be cleared.
type failingClear struct{ snapshotindex.Store }

func (failingClear) ClearTombstones([]string) error { return errors.New("index read-only") }

// TestRetryPendingWritesNothingWhenNothingWasDeleted: a retry whose deletes
// the provider all refused (a fork stands on them) clears no tombstone, so
// an index that cannot be written fails nothing.
func TestRetryPendingWritesNothingWhenNothingWasDeleted(t *testing.T) {
	ctx := context.Background()
	fk := fake.New(fake.Options{Seed: 1})
	h, err := fk.Start(ctx, provider.Spec{Image: "notes"})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := fk.Snapshot(ctx, h, "held")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fk.Fork(ctx, provider.Spec{Image: "someone-else"}, snap); err != nil {
		t.Fatal(err)
	}
	idx := open(t, t.TempDir())
	if err := idx.AddTombstones([]snapshotindex.Tombstone{{SnapshotID: snap, Provider: fk.Name(), Reason: "release", At: t0}}); err != nil {
		t.Fatal(err)
	}
	rep, err := sweep.RetryPending(ctx, sweep.PendingOptions{Provider: fk, Index: failingClear{idx}, Now: t0})
	if err != nil || !cmp.Equal([]string{snap}, rep.Deferred) {
		t.Fatalf("retry of a delete refused as in use: %+v, %v", rep, err)
	}
}
