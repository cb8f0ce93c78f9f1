package app_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/app"
	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/sweep"
)

// sweepServer is a server on a fake provider and a manual clock whose own
// sweep passes every minute; pass advances the clock by a minute and
// returns the pass it made. The sweep's timer is the clock's only one (no
// lease ticker), so the wait for one pending timer is the wait for the
// sweep's: with the ticker's too, whichever goroutine armed first ended
// it, and a pass that advanced the clock before the sweep armed its timer
// would wait for a pass a minute later, for ever.
func sweepServer(t *testing.T, orphans time.Duration) (*app.App, *fake.Provider, func() sweep.Pass) {
	t.Helper()
	clk := clock.NewManual(time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC))
	fk := fake.New(fake.Options{Clock: clk})
	passes := make(chan sweep.Pass, 1)
	a, _, _ := startFake(t, t.TempDir(), fk, app.Deps{Clock: clk, LeaseTick: -1, OnSweep: func(p sweep.Pass) { passes <- p }}, func(c *app.Config) {
		c.Sweep.Interval, c.Sweep.Retention.Orphans, c.Sweep.Retention.PendingDeletes = time.Minute, orphans, 0
		c.Sweep.Retention.Templates = 2 * time.Minute
	})
	clk.WaitPending(1, nil)
	return a, fk, func() sweep.Pass {
		t.Helper()
		clk.Advance(time.Minute)
		p := <-passes
		if p.Err != nil {
			t.Fatalf("pass at %v: %v", p.At, p.Err)
		}
		return p
	}
}

var noSetup sandbox.SetupFunc = func(context.Context, provider.Provider, sandbox.Sandbox) (json.RawMessage, error) { return nil, nil }

// TestServerSweepRemovesLeaksAfterTheRetention: a sandbox and a snapshot of
// the server's that nothing accounts for are removed by the first pass at
// least the retention after the first that saw them; the sandbox a session
// holds, the checkpoint's snapshot and the sandbox of a session still
// starting are never removed; /health and the metrics report it per kind.
func TestServerSweepRemovesLeaksAfterTheRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, fk, pass := sweepServer(t, 2*time.Minute)
	held, err := a.Owner().StartSessionSandbox(ctx, "s1", provider.Spec{Image: "notes"}, noSetup, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Owner().Commit(ctx, owner.CommitRequest{CheckpointID: "c1"}); err != nil {
		t.Fatal(err)
	}
	named := fk.SnapshotIDs()
	labels := func(session string) map[string]string {
		return map[string]string{owner.LabelOwner: "notes", owner.LabelSession: session}
	}
	leak, err := fk.Start(ctx, provider.Spec{Image: "notes", Metadata: labels("ended")})
	if err != nil {
		t.Fatal(err)
	}
	leakSnap, err := fk.Snapshot(ctx, leak, "leaked")
	if err != nil {
		t.Fatal(err)
	}
	// As a seed's sandbox is before its session holds it.
	starting, err := fk.Start(ctx, provider.Spec{Image: "notes", Metadata: labels("s1")})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct{ found, waiting, removed int }{{2, 2, 0}, {2, 2, 0}, {2, 0, 2}, {0, 0, 0}} {
		p := pass()
		st := a.Sweep().Status()
		sb, sn := st.Kinds[sweep.KindSandbox], st.Kinds[sweep.KindSnapshot]
		got := struct{ found, waiting, removed int }{sb.Found + sn.Found, sb.Waiting + sn.Waiting, sb.Removed + sn.Removed}
		if got != want {
			t.Fatalf("pass %d at %v: found/waiting/removed %+v, want %+v (%+v)", i, p.At, got, want, p.Orphans)
		}
	}
	if diff := cmp.Diff(sorted(held.Handle.SandboxID, starting.SandboxID), fk.LiveSandboxIDs()); diff != "" {
		t.Errorf("sandboxes left (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(named, fk.SnapshotIDs()); diff != "" || slices.Contains(named, leakSnap) {
		t.Errorf("snapshots left (-want +got):\n%s", diff)
	}
	_, body := get(t, a.Addr().String(), "/health")
	var h struct {
		Sweep struct {
			IntervalS  float64            `json:"interval_s"`
			RetentionS map[string]float64 `json:"retention_s"`
			Runs       map[string]int     `json:"runs"`
			LastRun    string             `json:"last_run"`
			Kinds      map[string]map[string]float64
		}
	}
	if err := json.Unmarshal([]byte(body), &h); err != nil {
		t.Fatal(err)
	}
	if h.Sweep.IntervalS != 60 || h.Sweep.RetentionS["orphans"] != 120 || h.Sweep.Runs["ok"] != 4 || h.Sweep.LastRun != "2026-12-04T10:04:00Z" ||
		h.Sweep.Kinds["sandbox"]["removed_total"] != 1 || h.Sweep.Kinds["snapshot"]["removed_total"] != 1 {
		t.Fatalf("/health sweep: %s", body)
	}
	fams := scrape(t, a.Addr().String())
	check{"sandboxes swept", counter(t, fams, "sandboxowner_sweep_removed_total", map[string]string{"kind": "sandbox"}), 1}.verify(t)
	check{"pending deletes swept", counter(t, fams, "sandboxowner_sweep_removed_total", map[string]string{"kind": "pending_delete"}), 0}.verify(t)
	check{"passes", counter(t, fams, "sandboxowner_sweep_runs_total", map[string]string{"outcome": "ok"}), 4}.verify(t)
}

func sorted(ids ...string) []string {
	slices.Sort(ids)
	return ids
}

// TestServerSweepRetriesAPendingDelete: a released checkpoint's snapshot a
// restored session's fork stands on is deferred by the release and by the
// passes while the fork lives; the first pass after the session ends
// deletes it and clears its tombstone.
func TestServerSweepRetriesAPendingDelete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, fk, pass := sweepServer(t, time.Hour)
	o := a.Owner()
	if _, err := o.StartSessionSandbox(ctx, "s1", provider.Spec{Image: "notes"}, noSetup, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Commit(ctx, owner.CommitRequest{CheckpointID: "c1"}); err != nil {
		t.Fatal(err)
	}
	if err := o.EndSessionSandbox(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Restore(ctx, owner.RestoreRequest{CheckpointID: "c1"}); err != nil {
		t.Fatal(err)
	}
	rel, err := o.Release(ctx, nil)
	if err != nil || len(rel.Deferred) != 1 {
		t.Fatalf("release: %+v, %v; want its snapshot deferred", rel, err)
	}
	p := pass()
	if diff := cmp.Diff(rel.Deferred, p.Pending.Deferred); diff != "" || len(p.Pending.Deleted) != 0 {
		t.Fatalf("pass with the fork live (-want +got):\n%s\ndeleted %v", diff, p.Pending.Deleted)
	}
	if err := o.EndSessionSandbox(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	p = pass()
	if diff := cmp.Diff(rel.Deferred, p.Pending.Deleted); diff != "" {
		t.Fatalf("pass after the fork ended deleted (-want +got):\n%s", diff)
	}
	if n, err := o.PendingDeletes(); err != nil || n != 0 || len(fk.SnapshotIDs()) != 0 {
		t.Fatalf("pending deletes %d (%v), snapshots %v", n, err, fk.SnapshotIDs())
	}
	if st := a.Sweep().Status().Kinds[sweep.KindPendingDelete]; st.RemovedTotal != 1 {
		t.Fatalf("pending deletes status %+v", st)
	}
}

// TestServerSweepOffWithoutAnIndex: a server that does not checkpoint has
// no index to tell a checkpoint's snapshot from a leak by: it does not
// sweep, and /health says why; its sweep families are there, at zero.
func TestServerSweepOffWithoutAnIndex(t *testing.T) {
	t.Parallel()
	a, _, _ := startFake(t, t.TempDir(), fake.New(fake.Options{}), app.Deps{}, func(c *app.Config) { c.Checkpoint.Enabled = false })
	_, body := get(t, a.Addr().String(), "/health")
	var h struct {
		Sweep struct {
			IntervalS float64 `json:"interval_s"`
			Off       string  `json:"off"`
		}
	}
	if err := json.Unmarshal([]byte(body), &h); err != nil {
		t.Fatal(err)
	}
	if h.Sweep.IntervalS != 0 || !strings.Contains(h.Sweep.Off, "no snapshot index") {
		t.Fatalf("/health sweep: %s", body)
	}
	fams := scrape(t, a.Addr().String())
	check{"passes", counter(t, fams, "sandboxowner_sweep_runs_total", map[string]string{"outcome": "ok"}), 0}.verify(t)
	check{"snapshots swept", counter(t, fams, "sandboxowner_sweep_removed_total", map[string]string{"kind": "snapshot"}), 0}.verify(t)
}

// TestServerSweepDropsUnusedTemplates: a keyed seed's template is kept
// while seeds use it, and dropped by the first pass after it went unused
// for sweep.retention.templates: out of the index, its snapshot deleted;
// /health and the metrics count it under the template kind.
func TestServerSweepDropsUnusedTemplates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, fk, pass := sweepServer(t, time.Hour)
	o := a.Owner()
	sb, err := o.StartKeyedSessionSandbox(ctx, "s1", "task-1", provider.Spec{Image: "notes"}, noSetup, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := o.EndSessionSandbox(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	for i, wantKept := range []bool{true, true, false} {
		p := pass()
		if got := slices.Contains(fk.SnapshotIDs(), sb.FromSnapshot); got != wantKept {
			t.Fatalf("pass %d at %v: template kept %t, want %t (%+v)", i, p.At, got, wantKept, p.Templates)
		}
	}
	if ts, err := o.Index().Templates(); err != nil || len(ts) != 0 {
		t.Fatalf("index templates %+v, %v", ts, err)
	}
	_, body := get(t, a.Addr().String(), "/health")
	var h struct {
		Sweep struct {
			RetentionS map[string]float64 `json:"retention_s"`
			Kinds      map[string]map[string]float64
		}
	}
	if err := json.Unmarshal([]byte(body), &h); err != nil {
		t.Fatal(err)
	}
	if h.Sweep.RetentionS["templates"] != 120 || h.Sweep.Kinds["template"]["removed_total"] != 1 {
		t.Fatalf("/health sweep: %s", body)
	}
	fams := scrape(t, a.Addr().String())
	check{"templates swept", counter(t, fams, "sandboxowner_sweep_removed_total", map[string]string{"kind": "template"}), 1}.verify(t)
}
