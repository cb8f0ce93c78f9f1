package harness

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/provider/fake"
)

func TestCheckpointRowFlag(t *testing.T) {
	ms := time.Millisecond
	good := CheckpointRow{Op: OpCommit, Sessions: 100, Calls: 100, Parallelism: 10, Latency: 20 * ms, Reps: 3,
		Measured: 210 * ms, Best: 205 * ms, Worst: 290 * ms, Index: 2 * ms}
	for _, tc := range []struct {
		name string
		edit func(r *CheckpointRow)
		want string
	}{
		{"trusted", func(*CheckpointRow) {}, ""},
		{"failed", func(r *CheckpointRow) { r.Err = "boom" }, "failed: boom"},
		{"spread at the bound", func(r *CheckpointRow) { r.Worst = 307500 * time.Microsecond }, ""},
		{"spread above it", func(r *CheckpointRow) { r.Worst = 308 * ms }, "spread 50% between reps"},
		{"one rep has no spread", func(r *CheckpointRow) { r.Reps, r.Worst = 1, time.Second }, ""},
		{"beats the ideal", func(r *CheckpointRow) { r.Measured = 201 * ms }, "impossible: 0.995 of the ideal"},
		{"at the ideal", func(r *CheckpointRow) { r.Measured = 202 * ms }, ""},
	} {
		r := good
		tc.edit(&r)
		if got := r.Flag(); got != tc.want {
			t.Errorf("%s: Flag() = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestHTTPRowFlag(t *testing.T) {
	res := func(n int64) LoadResult { return LoadResult{Iterations: n, Window: time.Second} }
	good := HTTPRow{Route: ScenarioAppendNote, Clients: 64, Server: res(600), Bare: res(1000), BareAfter: res(1200)}
	if got := good.Ratio(); got != 600.0/1100 {
		t.Errorf("Ratio() = %v, want server over the mean of both bare runs", got)
	}
	for _, tc := range []struct {
		name string
		edit func(r *HTTPRow)
		want string
	}{
		{"trusted", func(*HTTPRow) {}, ""},
		{"failed", func(r *HTTPRow) { r.Err = "nothing completed" }, "failed: nothing completed"},
		{"errors", func(r *HTTPRow) { r.Server.Errors, r.Server.FirstError = 3, "status 500" }, "3 errors (first: status 500)"},
		{"bare drifted", func(r *HTTPRow) { r.BareAfter = res(1300) }, "bare moved 30% during the cell"},
		{"bare drifted down", func(r *HTTPRow) { r.BareAfter = res(700) }, "bare moved 30% during the cell"},
		{"beats bare", func(r *HTTPRow) { r.Server = res(1250) }, "impossible: 114% of bare"},
		{"no second bare run", func(r *HTTPRow) { r.BareAfter = LoadResult{} }, ""},
	} {
		r := good
		tc.edit(&r)
		if got := r.Flag(); got != tc.want {
			t.Errorf("%s: Flag() = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestFlaggedFiguresAreNotPrinted: a flagged goal cell shows why, never its
// ratio, and does not count as met or missed.
func TestFlaggedFiguresAreNotPrinted(t *testing.T) {
	row := CheckpointRow{Op: OpCommit, Sessions: goalSessions, Calls: goalSessions, Parallelism: goalParallelism, Latency: goalLatency,
		Reps: 3, Measured: 100 * time.Millisecond, Best: 90 * time.Millisecond, Worst: 110 * time.Millisecond, Index: 10 * time.Millisecond}
	rep := &Report{Commit: []CheckpointRow{row}}
	g := rep.Goals()[0]
	if g.Met != nil || !strings.HasPrefix(g.Measured, "flagged: impossible") {
		t.Errorf("goal of an impossible cell: %+v", g)
	}
	table := CheckpointTable(rep.Commit)
	if !strings.Contains(table, "**flagged**: impossible") || strings.Contains(table, "| 0.303 |") {
		t.Errorf("table prints a flagged ratio:\n%s", table)
	}
}

// TestRunGoesOnPastFailedCells: a checkpoint cell that fails, and HTTP cells
// whose load finds nothing but errors, are reported as failed; every other
// cell is still measured, and the report is handed out after each cell.
func TestRunGoesOnPastFailedCells(t *testing.T) {
	t.Parallel() // beside TestTinyRun
	srv := newFlakyServer(t)
	var updates []int
	var partial []bool
	rep, err := Run(context.Background(), Options{
		Mode:     ModeTiny,
		Sections: []string{SectionCommit, SectionHTTP},
		Server:   func(context.Context, string) (Target, error) { return srv, nil },
		OnUpdate: func(r *Report) {
			updates = append(updates, len(r.Commit)+len(r.Restore)+len(r.HTTP))
			partial = append(partial, r.Partial)
		},
		breakCell: func(r CheckpointRow) error {
			if r.Op == OpCommit && r.Sessions == 1 && r.Latency > 0 {
				return errors.New("injected")
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	var failed []string
	for _, r := range append(append([]CheckpointRow(nil), rep.Commit...), rep.Restore...) {
		if r.Err != "" {
			failed = append(failed, r.Op+" "+r.Err)
		} else if r.Reps < 1 || r.Measured <= 0 {
			t.Errorf("cell not measured: %+v", r)
		}
	}
	if diff := cmp.Diff([]string{"commit injected"}, failed); diff != "" {
		t.Errorf("failed cells (-want +got):\n%s", diff)
	}
	if len(rep.Commit) != 4 || len(rep.Restore) != 4 {
		t.Errorf("%d commit and %d restore rows, want 4 each", len(rep.Commit), len(rep.Restore))
	}
	var httpFailed []string
	for _, r := range rep.HTTP {
		if r.Err != "" {
			httpFailed = append(httpFailed, r.Route)
		} else if r.Server.Iterations == 0 {
			t.Errorf("HTTP cell not measured: %+v", r)
		}
	}
	if diff := cmp.Diff([]string{ScenarioAppendNote}, httpFailed); diff != "" {
		t.Errorf("failed HTTP cells (-want +got):\n%s", diff)
	}
	cells := len(rep.Commit) + len(rep.Restore) + len(rep.HTTP)
	if len(updates) < cells || updates[len(updates)-1] != cells {
		t.Errorf("updates saw %v cells, want one update per cell up to %d", updates, cells)
	}
	if !partial[0] || partial[len(partial)-1] || rep.Partial {
		t.Errorf("partial flags %v (final %v), want partial until the end", partial, rep.Partial)
	}
	md := rep.Markdown()
	for _, want := range []string{"**failed**: injected", "**failed**: load /append_note"} {
		if !strings.Contains(md, want) {
			t.Errorf("the report has no %q", want)
		}
	}
}

// newFlakyServer answers every route as the notes server would, except
// /append_note, which fails after the harness's first probe of it.
func newFlakyServer(t *testing.T) Target {
	t.Helper()
	var mu sync.Mutex
	appends := 0
	tg, err := serve(func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		switch string(ctx.Path()) {
		case "/seed_session":
			ctx.Response.Header.Set("Set-Cookie", "s=1; Path=/")
			ctx.SetBodyString(`{}`)
		case "/append_note":
			mu.Lock()
			appends++
			n := appends
			mu.Unlock()
			if n > 1 {
				ctx.SetStatusCode(fasthttp.StatusInternalServerError)
			}
			ctx.SetBodyString(`{"ok":true}`)
		default:
			ctx.SetBodyString(`{"ok":true}`)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tg.Close() })
	return tg
}

// A flag that held when its cell was measured again says so; only noise
// (bare runs that disagree, a server that beat bare) makes an HTTP cell
// worth measuring again, not a failure or errors.
func TestRerunsAreSaid(t *testing.T) {
	ms := time.Millisecond
	row := CheckpointRow{Op: OpCommit, Sessions: 100, Calls: 100, Parallelism: 10, Latency: 20 * ms, Reps: 3,
		Measured: 210 * ms, Best: 205 * ms, Worst: 400 * ms, Index: 2 * ms, Reruns: 1}
	if got, want := row.Flag(), "spread 95% between reps, again when rerun"; got != want {
		t.Errorf("Flag() = %q, want %q", got, want)
	}
	res := func(n int64) LoadResult { return LoadResult{Iterations: n, Window: time.Second} }
	good := HTTPRow{Route: ScenarioAppendNote, Clients: 64, Server: res(600), Bare: res(1000), BareAfter: res(1000)}
	for _, tc := range []struct {
		name  string
		edit  func(r *HTTPRow)
		noisy bool
		flag  string
	}{
		{"trusted", func(*HTTPRow) {}, false, ""},
		{"bare drifted", func(r *HTTPRow) { r.BareAfter = res(1300) }, true, "bare moved 30% during the cell"},
		{"bare drifted, rerun", func(r *HTTPRow) { r.BareAfter, r.Reruns = res(1300), 1 }, true, "bare moved 30% during the cell, again when rerun"},
		{"beats bare", func(r *HTTPRow) { r.Server = res(1200) }, true, "impossible: 120% of bare"},
		{"errors", func(r *HTTPRow) { r.Server.Errors, r.BareAfter = 1, res(1300) }, false, "1 errors (first: )"},
		{"failed", func(r *HTTPRow) { r.Err = "x" }, false, "failed: x"},
	} {
		r := good
		tc.edit(&r)
		if r.Noisy() != tc.noisy || r.Flag() != tc.flag {
			t.Errorf("%s: Noisy() %v, Flag() %q; want %v, %q", tc.name, r.Noisy(), r.Flag(), tc.noisy, tc.flag)
		}
	}
}

// A checkpoint cell whose reps disagree is measured again, its reps
// numbered on (a commit's id names its rep); the second measure's figures
// are the cell's. A cell that measures clean the first time is not.
func TestANoisyCellIsMeasuredAgain(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name   string
		times  []time.Duration
		reps   []int
		reruns int
		flag   string
	}{
		{"clean", []time.Duration{100 * ms, 101 * ms, 102 * ms}, []int{0, 1, 2}, 0, ""},
		{"noisy, then clean", []time.Duration{100 * ms, 300 * ms, 101 * ms, 100 * ms, 101 * ms, 102 * ms}, []int{0, 1, 2, 3, 4, 5}, 1, ""},
		{"noisy twice", []time.Duration{100 * ms, 300 * ms, 101 * ms, 100 * ms, 300 * ms, 101 * ms}, []int{0, 1, 2, 3, 4, 5}, 1, "spread 200% between reps, again when rerun"},
	} {
		h := &harness{opts: Options{Progress: io.Discard}, plan: plan{maxReps: 3, budget: time.Hour}, rep: &Report{}, waits: map[time.Duration]time.Duration{}}
		var reps []int
		h.cell(fake.New(fake.Options{}), fake.OpSnapshot, CheckpointRow{Op: OpCommit, Sessions: 1, Calls: 1, Parallelism: 1},
			func(r int) (time.Duration, time.Duration, error) {
				reps = append(reps, r)
				return tc.times[len(reps)-1], 0, nil
			})
		if len(h.rep.Commit) != 1 {
			t.Fatalf("%s: %d rows", tc.name, len(h.rep.Commit))
		}
		row := h.rep.Commit[0]
		if diff := cmp.Diff(tc.reps, reps); diff != "" || row.Reruns != tc.reruns || row.Flag() != tc.flag || row.Reps != 3 {
			t.Errorf("%s: reps %v, reruns %d, flag %q (%d reps); want %v, %d, %q", tc.name, reps, row.Reruns, row.Flag(), row.Reps, tc.reps, tc.reruns, tc.flag)
		}
	}
}

// The fake's own cost is measured for every checkpoint op: its forks are
// stopped before the snapshots they stand on are deleted (the fake refuses
// that delete otherwise).
func TestFakeCostMeasuresEveryOp(t *testing.T) {
	cost, err := fakeCost(context.Background(), 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []fake.Op{fake.OpSnapshot, fake.OpFork, fake.OpDeleteSnapshot} {
		if cost[op] <= 0 {
			t.Errorf("%s: cost %v", op, cost[op])
		}
	}
}
