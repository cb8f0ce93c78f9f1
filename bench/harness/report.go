package harness

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/provider/local"
)

// Report is everything one run measured.
type Report struct {
	Mode    string
	Machine Machine
	Took    time.Duration
	Commit  []CheckpointRow
	Restore []CheckpointRow
	Release []CheckpointRow
	HTTP    []HTTPRow
	Memory  *MemoryResult
	// Skipped maps a section that cannot run here to the reason.
	Skipped map[string]string
	// Failed maps a section (or a part of one) that failed to start to
	// the error; the rest of the run went on.
	Failed map[string]string
	// Partial is true while the run goes on (a report written as cells
	// finish), and after a run that was interrupted.
	Partial bool
	// Waits maps each provider latency to what a Go timer of it really
	// waited on this machine (the floor's unit).
	Waits map[time.Duration]time.Duration
	// FakeCost is the fake provider's own time per call at zero latency
	// (snapshot, fork, delete_snapshot), included in every L=0 overhead.
	FakeCost map[fake.Op]time.Duration
	// Phases splits the goal cell's commit and restore (nil when the
	// commit section did not run).
	Phases *Phases
	// Sandboxes is commit and restore of real sandboxes on the local
	// provider (nil when the section did not run).
	Sandboxes *SandboxesResult
	// Scale is the 10,000 sessions over HTTP (nil when it did not run).
	Scale *ScaleResult
}

// The project's performance goals (to report against, not assertions).
const (
	GoalRatio           = 1.05                  // commit and restore at N=1000, L=20ms, P=64
	GoalCoordinatorUS   = 20.0                  // µs per session at L=0
	GoalHTTPRatio       = 0.70                  // of bare fasthttp's throughput
	GoalIdleSessionKiB  = 16.0                  // resident KiB per idle session
	GoalPause           = 50 * time.Millisecond // a snapshot's pause of a real sandbox, overlay mode
	goalSessions        = 1000
	goalParallelism     = 64
	goalLatency         = 20 * time.Millisecond
	chartFile           = "results.svg"
	resultsFile         = "results.md"
	notMeasured         = "not measured"
	goalMetYes, goalNot = "yes", "**no**"
)

// Goal is one line of the goals table.
type Goal struct {
	Name, Target, Measured string
	// Met is nil when the figure was not measured in this run.
	Met *bool
}

func (r *Report) find(rows []CheckpointRow, n int, lat time.Duration, par int) (CheckpointRow, bool) {
	for _, row := range rows {
		if row.Sessions == n && row.Latency == lat && row.Parallelism == par {
			return row, true
		}
	}
	return CheckpointRow{}, false
}

func met(b bool) *bool { return &b }

// Goals evaluates the figures against the targets set for them (Target
// and Met in each Goal).
func (r *Report) Goals() []Goal {
	var gs []Goal
	for _, op := range []struct {
		name string
		rows []CheckpointRow
	}{{OpCommit, r.Commit}, {OpRestore, r.Restore}} {
		g := Goal{Name: fmt.Sprintf("%s of %d sessions, L=20ms, P=%d, against the ideal", op.name, goalSessions, goalParallelism),
			Target: fmt.Sprintf("≤ ×%.2f", GoalRatio), Measured: notMeasured}
		if row, ok := r.find(op.rows, goalSessions, goalLatency, goalParallelism); ok {
			if f := row.Flag(); f != "" {
				g.Measured = "flagged: " + f
			} else {
				g.Measured = fmt.Sprintf("×%.3f (%s against %s; ×%.3f against the floor)", row.Ratio(), fmtDur(row.Measured), fmtDur(row.Ideal()), row.FloorRatio())
				g.Met = met(row.Ratio() <= GoalRatio)
			}
		}
		gs = append(gs, g)
	}
	for _, op := range []struct {
		name string
		rows []CheckpointRow
	}{{OpCommit, r.Commit}, {OpRestore, r.Restore}} {
		g := Goal{Name: fmt.Sprintf("coordinator cost per session, %s of %d at L=0, P=%d", op.name, goalSessions, goalParallelism),
			Target: fmt.Sprintf("≤ %.0f µs", GoalCoordinatorUS), Measured: notMeasured}
		if row, ok := r.find(op.rows, goalSessions, 0, goalParallelism); ok {
			if f := row.Flag(); f != "" {
				g.Measured = "flagged: " + f
			} else {
				g.Measured = fmt.Sprintf("%.1f µs", row.OverheadMicros())
				g.Met = met(row.OverheadMicros() <= GoalCoordinatorUS)
			}
		}
		gs = append(gs, g)
	}
	g := Goal{Name: "HTTP throughput against bare fasthttp (worst route and C)", Target: fmt.Sprintf("≥ %.0f%%", GoalHTTPRatio*100), Measured: notMeasured}
	if reason, ok := r.Skipped[SectionHTTP]; ok {
		g.Measured = "skipped: " + reason
	}
	if reason, ok := r.Failed[SectionHTTP]; ok {
		g.Measured = "failed: " + reason
	}
	var worst *HTTPRow
	var flagged []string
	for i, h := range r.HTTP {
		if f := h.Flag(); f != "" {
			flagged = append(flagged, fmt.Sprintf("%s C=%d", h.Route, h.Clients))
			continue
		}
		if worst == nil || h.Ratio() < worst.Ratio() {
			worst = &r.HTTP[i]
		}
	}
	var worstCPU *HTTPRow // flagged cells too: their noise is the throughput's
	for i, h := range r.HTTP {
		if q := h.CPURatio(); q > 0 && (worstCPU == nil || q < worstCPU.CPURatio()) {
			worstCPU = &r.HTTP[i]
		}
	}
	switch {
	case worst != nil:
		g.Measured = fmt.Sprintf("%.0f%% (%s, C=%d)", worst.Ratio()*100, worst.Route, worst.Clients)
		g.Met = met(worst.Ratio() >= GoalHTTPRatio)
		if len(flagged) > 0 {
			g.Measured += fmt.Sprintf("; flagged, not counted: %s", strings.Join(flagged, ", "))
			if worst.Ratio() >= GoalHTTPRatio {
				g.Met = nil // the flagged cells could still miss it
			}
		}
	case len(flagged) > 0:
		g.Measured = "every cell flagged: " + strings.Join(flagged, ", ")
	}
	if worstCPU != nil {
		g.Measured += fmt.Sprintf("; CPU ratio, worst: %.0f%% (%s, C=%d)", worstCPU.CPURatio()*100, worstCPU.Route, worstCPU.Clients)
	}
	gs = append(gs, g)
	g = Goal{Name: "resident memory per idle session (owner's share)", Target: fmt.Sprintf("≤ %.0f KiB", GoalIdleSessionKiB), Measured: notMeasured}
	if reason, ok := r.Failed[SectionMemory]; ok {
		g.Measured = "failed: " + reason
	}
	if m := r.Memory; m != nil {
		g.Measured = fmt.Sprintf("%.1f KiB at %d sessions (%.1f KiB with the fake's sandboxes)", m.OwnerRSSPer()/1024, m.Owner.Sessions, m.Owner.RSSPer()/1024)
		g.Met = met(m.OwnerRSSPer()/1024 <= GoalIdleSessionKiB)
	}
	gs = append(gs, g)
	return append(gs, r.pauseGoal(), r.scaleGoal())
}

// scaleGoal is the errors of the scale run: every request answered, every
// session verified after the restore.
func (r *Report) scaleGoal() Goal {
	g := Goal{Name: "errors over HTTP: sessions seeded, calling, committed, restored into a fresh server, verified", Target: "0", Measured: notMeasured}
	if reason, ok := r.Failed[SectionScale]; ok {
		g.Measured = "failed: " + reason
	}
	if sc := r.Scale; sc != nil {
		g.Measured = fmt.Sprintf("%d errors; %d of %d sessions verified", sc.Errors, sc.Verified, sc.Sessions)
		if sc.FirstError != "" {
			g.Measured += " (first: " + oneLine(sc.FirstError) + ")"
		}
		g.Met = met(sc.Errors == 0 && sc.Verified == sc.Sessions)
	}
	return g
}

// pauseGoal is the worst pause a snapshot gave a real sandbox in overlay
// mode, over every N measured.
func (r *Report) pauseGoal() Goal {
	g := Goal{Name: "pause of a real sandbox by its snapshot, overlay mode (worst over N)", Target: "< " + fmtDur(GoalPause), Measured: notMeasured}
	sb := r.Sandboxes
	if reason, ok := r.Failed[SectionSandboxes]; ok {
		g.Measured = "failed: " + reason
	}
	if sb == nil {
		return g
	}
	if reason, ok := sb.Skipped[modeName(local.OverlayOn)]; ok {
		g.Measured = "skipped: " + reason
	}
	var worst time.Duration
	n := 0
	for _, row := range sb.Rows {
		if row.Mode != local.OverlayOn || row.Op != OpCommit || row.Err != "" || len(row.Pauses) == 0 {
			continue
		}
		n++
		worst = max(worst, row.PauseQuantile(1))
	}
	if n > 0 {
		g.Measured = fmt.Sprintf("%s (copying the changed files alone: %s)", fmtDur(worst), fmtDur(sb.Rows[0].Floor))
		g.Met = met(worst < GoalPause)
	}
	return g
}

func fmtDur(d time.Duration) string {
	switch a := max(d, -d); {
	case a == 0:
		return "0"
	case a < 10*time.Microsecond:
		return fmt.Sprintf("%.1fµs", float64(d)/1e3)
	case a < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	case a < 100*time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	case a < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.3fs", d.Seconds())
	}
}

// GoalsMarkdown is the goals table.
func (r *Report) GoalsMarkdown() string {
	var b strings.Builder
	b.WriteString("| goal | target | measured | met |\n|---|---|---|---|\n")
	for _, g := range r.Goals() {
		m := "—"
		if g.Met != nil {
			m = goalNot
			if *g.Met {
				m = goalMetYes
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", g.Name, g.Target, g.Measured, m)
	}
	return b.String()
}

// CheckpointTable is one operation's rows as a markdown table. A flagged
// row (failed, spread, impossible) shows why in place of its ratio and
// overhead, which are not figures then.
func CheckpointTable(rows []CheckpointRow) string {
	var b strings.Builder
	release := len(rows) > 0 && rows[0].Op == OpRelease
	cols := "| L | P | reps | measured | best | worst | ideal | index alone | ratio | floor | to floor | overhead µs/%s | peak | load |\n"
	align := "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	if release {
		b.WriteString("| K | N | deletes " + fmt.Sprintf(cols, "delete") + "|---:|---:|---:" + align + "\n")
	} else {
		b.WriteString("| N " + fmt.Sprintf(cols, "session") + "|---:" + align + "\n")
	}
	for _, r := range rows {
		if release {
			fmt.Fprintf(&b, "| %d | %d | %d ", r.Checkpoints, r.Sessions, r.Calls)
		} else {
			fmt.Fprintf(&b, "| %d ", r.Sessions)
		}
		if r.Err != "" {
			fmt.Fprintf(&b, "| %s | %d | — | **failed**: %s | | | | | | | | | | %s |\n", fmtDur(r.Latency), r.Parallelism, r.Err, r.Load)
			continue
		}
		ratio, floorRatio, over := fmt.Sprintf("%.3f", r.Ratio()), fmt.Sprintf("%.3f", r.FloorRatio()), fmt.Sprintf("%.1f", r.OverheadMicros())
		if f := r.Flag(); f != "" {
			ratio, floorRatio, over = "**flagged**: "+f, "—", "—"
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d | %s |\n",
			fmtDur(r.Latency), r.Parallelism, r.Reps, fmtDur(r.Measured), fmtDur(r.Best), fmtDur(r.Worst), fmtDur(r.Ideal()), fmtDur(r.Index), ratio,
			fmtDur(r.Floor()), floorRatio, over, r.Peak, r.Load)
	}
	return b.String()
}

// HTTPTable is the HTTP rows as a markdown table.
func HTTPTable(rows []HTTPRow) string {
	var b strings.Builder
	b.WriteString("| route | C | req/s | p50 | p99 | errors | bare req/s (before, after) | bare p50 | bare p99 | reply bytes | ratio | CPU per iteration: server, bare, load generator | CPU ratio | load |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		if r.Err != "" {
			fmt.Fprintf(&b, "| %s | %d | **failed**: %s | | | | | | | | | | | %s |\n", r.Route, r.Clients, r.Err, r.Load)
			continue
		}
		cpu, cpuRatio := "—", "—"
		if q := r.CPURatio(); q > 0 {
			cpu = fmt.Sprintf("%s, %s, %s", fmtDur(r.Server.ServerCPUPer()), fmtDur(r.Bare.ServerCPUPer()), fmtDur(r.Server.ClientCPUPer()))
			cpuRatio = fmt.Sprintf("%.0f%%", q*100)
		}
		ratio := fmt.Sprintf("%.0f%%", r.Ratio()*100)
		if f := r.Flag(); f != "" {
			ratio = "**flagged**: " + f
		}
		fmt.Fprintf(&b, "| %s | %d | %.0f | %s | %s | %d | %.0f (%.0f, %.0f) | %s | %s | %d | %s | %s | %s | %s |\n",
			r.Route, r.Clients, r.Server.RPS(), fmtDur(r.Server.P50), fmtDur(r.Server.P99), r.Server.Errors,
			r.BareRPS(), r.Bare.RPS(), r.BareAfter.RPS(), fmtDur(r.Bare.P50), fmtDur(r.Bare.P99), r.ReplyBytes, ratio, cpu, cpuRatio, r.Load)
	}
	return b.String()
}

// SandboxTable is the sandboxes section as a markdown table.
func SandboxTable(sb *SandboxesResult) string {
	var b strings.Builder
	b.WriteString("| mode | op | N | wall | copied | pause p50 | pause p99 | pause max | floor (changed files) | load |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range sb.Rows {
		if r.Err != "" {
			fmt.Fprintf(&b, "| %s | %s | %d | **failed**: %s | | | | | | %s |\n", modeName(r.Mode), r.Op, r.Sessions, r.Err, r.Load)
			continue
		}
		p50, p99, pmax := "—", "—", "—"
		if len(r.Pauses) > 0 {
			p50, p99, pmax = fmtDur(r.PauseQuantile(0.5)), fmtDur(r.PauseQuantile(0.99)), fmtDur(r.PauseQuantile(1))
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %.1f MiB | %s | %s | %s | %s | %s |\n",
			modeName(r.Mode), r.Op, r.Sessions, fmtDur(r.Wall), float64(r.Bytes)/(1<<20), p50, p99, pmax, fmtDur(r.Floor), r.Load)
	}
	for _, m := range slices.Sorted(maps.Keys(sb.Skipped)) {
		fmt.Fprintf(&b, "\n%s mode skipped: %s\n", m, sb.Skipped[m])
	}
	return b.String()
}

// ScaleTable is the scale section as markdown tables.
func ScaleTable(sc *ScaleResult) string {
	var b strings.Builder
	b.WriteString("| route | requests | errors | req/s | p50 | p99 |\n|---|---:|---:|---:|---:|---:|\n")
	for _, k := range []string{scaleSeed, scaleAppend, scaleReseed, scaleVerify} {
		r, ok := sc.Routes[k]
		if !ok {
			continue
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %.0f | %s | %s |\n", k, r.Iterations, r.Errors, r.RPS(), fmtDur(r.P50), fmtDur(r.P99))
	}
	b.WriteString("\n| | |\n|---|---|\n")
	for _, k := range []string{scaleCommit, scaleRestore} {
		if d, ok := sc.Control[k]; ok {
			fmt.Fprintf(&b, "| %s of %d sessions (wall) | %s |\n", k, sc.Sessions, fmtDur(d))
		}
	}
	fmt.Fprintf(&b, "| resident memory per live session (server process, the fake's sandboxes included) | %.1f KiB |\n", sc.RSSPer/1024)
	fmt.Fprintf(&b, "| sessions verified after the restore | %d of %d |\n", sc.Verified, sc.Sessions)
	fmt.Fprintf(&b, "| errors | %d |\n", sc.Errors)
	if sc.FirstError != "" {
		fmt.Fprintf(&b, "| first error | %s |\n", oneLine(sc.FirstError))
	}
	fmt.Fprintf(&b, "| load average (1 min) at start, end | %s, %s |\n", sc.LoadStart, sc.LoadEnd)
	return b.String()
}

// MemoryTable is the memory section as a markdown table.
func MemoryTable(m *MemoryResult) string {
	var b strings.Builder
	b.WriteString("| process | sessions | RSS before | RSS after | RSS per session | heap per session | goroutines after |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range []MemorySample{m.Owner, m.Fake} {
		name := "owner on the fake (everything)"
		if s.What == "fake" {
			name = "the fake's sandboxes alone"
		}
		fmt.Fprintf(&b, "| %s | %d | %.1f MiB | %.1f MiB | %.2f KiB | %.2f KiB | %d |\n",
			name, s.Sessions, float64(s.RSSBefore)/(1<<20), float64(s.RSSAfter)/(1<<20), s.RSSPer()/1024, s.HeapPer()/1024, s.Goroutines)
	}
	fmt.Fprintf(&b, "| **the owner's share** (difference) | | | | **%.2f KiB** | **%.2f KiB** | |\n", m.OwnerRSSPer()/1024, m.OwnerHeapPer()/1024)
	return b.String()
}

// Markdown is the whole report, as bench/results.md holds it.
func (r *Report) Markdown() string {
	var b strings.Builder
	b.WriteString("# Benchmark results\n\n")
	fmt.Fprintf(&b, "Written by `go run ./bench%s` in %s. How to read it: bench/README.md.\n\n", map[bool]string{true: " -quick", false: ""}[r.Mode == ModeQuick], r.Took.Round(time.Second))
	if r.Partial {
		b.WriteString("**Partial**: the run had not finished when this was written (it goes on, or it was interrupted); what is here was measured.\n\n")
	}
	if len(r.Failed) > 0 {
		b.WriteString("**Failed** (the run went on without them):\n\n")
		for _, k := range slices.Sorted(maps.Keys(r.Failed)) {
			fmt.Fprintf(&b, "- %s: %s\n", k, r.Failed[k])
		}
		b.WriteString("\n")
	}
	b.WriteString("## Machine\n\n" + r.Machine.markdown())
	for _, l := range slices.Sorted(maps.Keys(r.Waits)) {
		if l > 0 {
			fmt.Fprintf(&b, "| a %s timer waits | %s |\n", fmtDur(l), fmtDur(r.Waits[l]))
		}
	}
	if len(r.FakeCost) > 0 {
		fmt.Fprintf(&b, "| the fake's own cost per call at L=0 (snapshot, fork, delete) | %s, %s, %s |\n",
			fmtDur(r.FakeCost[fake.OpSnapshot]), fmtDur(r.FakeCost[fake.OpFork]), fmtDur(r.FakeCost[fake.OpDeleteSnapshot]))
	}
	b.WriteString("\n")
	b.WriteString("## Goals\n\n" + r.GoalsMarkdown() + "\n")
	section := func(title, intro string, body string) {
		b.WriteString("## " + title + "\n\n" + intro + "\n\n" + body + "\n")
	}
	ideal := "Ideal is ⌈calls/P⌉·L plus the operation's index transaction measured alone in the same run " +
		"(%s); ratio is measured/ideal; overhead is (measured − ideal)/calls, at L=0 the coordinator's cost per session. " +
		"Times are medians over reps (best, worst: the fastest and slowest rep); peak is the most concurrent provider calls the fake saw; load is the 1-minute load average when the cell ended. " +
		fmt.Sprintf("A cell whose reps spread by more than %.0f%%%% (worst against best), or that beat its ideal, is measured again once; still so, it is flagged and its ratio is not a figure. ", MaxSpread*100) +
		"Floor is the ideal with the wait a Go timer of L really gives here (Wait, measured at the start of the run) in place of L: " +
		"no program sleeping on timers beats it, so 'to floor' (measured/floor) is the owner's own share of the ratio."
	if len(r.Commit) > 0 {
		section("Commit", fmt.Sprintf("N live sessions on the fake, snapshot latency L, parallelism P. "+ideal, "the same N records committed straight into snapshotindex"), CheckpointTable(r.Commit))
	}
	if len(r.Restore) > 0 {
		section("Restore", fmt.Sprintf("A fresh owner (as after a restart) forks the N sessions of a checkpoint back, fork latency L. "+ideal, "the checkpoint's N records loaded from snapshotindex"), CheckpointTable(r.Restore))
	}
	if p := r.Phases; p != nil {
		section("Where the time goes", fmt.Sprintf("One commit and one restore of N=%d sessions at P=%d, L=%s, cut at the first and last provider call of each kind (the fake's call hook); medians of %d. The ideal's provider part is %s.",
			p.Sessions, p.Parallelism, fmtDur(p.Latency), p.Reps, fmtDur(time.Duration((p.Sessions+p.Parallelism-1)/p.Parallelism)*p.Latency)), PhasesMarkdown(p))
	}
	if len(r.Release) > 0 {
		section("Release", fmt.Sprintf("Release of K checkpoints of N sessions each: K·N snapshot deletes at delete latency L. "+ideal, "one Drop of the K checkpoints with their K·N tombstones"), CheckpointTable(r.Release))
	}
	if len(r.HTTP) > 0 {
		section("HTTP", fmt.Sprintf("C concurrent keep-alive clients in a separate process, each on its own session, for the same duration against the owner's server and against a bare fasthttp handler answering the same number of bytes on the same route, run before and again after the server's. Ratio is req/s against the mean of the two bare runs. A cell with errors, whose bare runs differ by more than %.0f%%, or that beats bare by more than %.0f%%, is measured again once, then flagged if it still is (one with errors at once).", MaxBareDrift*100, (MaxHTTPRatio-1)*100)+" seed+close counts one seed and one close as one request (their latency is the pair's). CPU per iteration is the CPU time the server's process (the harness) and the load generator used in the window over the iterations in it; CPU ratio is bare's (server and load generator, the mean of its two runs) over the owner's: the ratio were CPU the only limit, which other work on the machine hardly moves.", HTTPTable(r.HTTP))
	} else if reason, ok := r.Skipped[SectionHTTP]; ok {
		section("HTTP", "Skipped: "+reason+".", "")
	}
	if sb := r.Sandboxes; sb != nil {
		section("Real sandboxes", fmt.Sprintf("Sessions on the local provider (no isolation), each a checkout of the benchmark's Go module (%d files, %.1f MiB) in which the agent changed %d files; the owner commits them (parallelism %d) and a fresh owner restores them. Copied is what the operation wrote (snapshot layers; the forks' own trees). Pause is how long each sandbox's snapshot held it (commands stopped, none starting); floor is copying only its changed files.",
			sb.Files, float64(sb.TreeBytes)/(1<<20), sb.Changed, sb.Parallelism), SandboxTable(sb))
	}
	if sc := r.Scale; sc != nil {
		section(fmt.Sprintf("%d sessions over HTTP", sc.Sessions), fmt.Sprintf("A load generator in its own process seeds %d notes sessions through HTTP (256 at a time), keeps %d of them appending notes for %s, then, as the controller, prepares, commits all of them and resumes. The server (the owner on the fake provider, in the harness process) then dies without a shutdown and a fresh server on the same state and provider restores every episode; each session re-seeds its next attempt with its cookie and verifies its notes (reward 1). Latencies are per request; req/s over the stretch the route ran.",
			sc.Sessions, sc.Active, sc.Load), ScaleTable(sc))
	}
	if r.Memory != nil {
		section("Memory", "Resident memory (VmRSS) and live Go heap after GC, before and after starting the sessions, each process fresh. The fake keeps every sandbox's files in memory; a real provider keeps them elsewhere, so the owner's share is the first row less the second.", MemoryTable(r.Memory))
	}
	if len(r.Commit) > 0 {
		b.WriteString("## Chart\n\n![commit and restore time against sessions](" + chartFile + ")\n")
	}
	return b.String()
}

// Write puts results.md and the chart in dir.
func (r *Report) Write(dir string) error {
	if err := os.WriteFile(filepath.Join(dir, resultsFile), []byte(r.Markdown()), 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	if len(r.Commit) > 0 {
		if err := os.WriteFile(filepath.Join(dir, chartFile), []byte(r.Chart()), 0o644); err != nil {
			return fmt.Errorf("write chart: %w", err)
		}
	}
	return nil
}
