// Package harness measures the sandbox owner against the project's performance goals:
// commit, restore and release latency against the ideal schedule on the fake
// provider, HTTP throughput against a bare fasthttp handler, and resident
// memory per live session. Run fills a Report; the Report prints itself as
// markdown tables and an SVG chart. Command bench (bench/main.go) is the thin main
// around it.
//
// Load and memory are measured in child processes (the load generator must
// not share the server's CPU scheduler and heap; memory wants a clean
// process): the harness starts its own executable again with ChildEnv set,
// and that executable's main (or TestMain) hands over to Child.
package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"time"

	"github.com/sandboxowner/owner/provider/fake"
)

// Options configure a run.
type Options struct {
	// Mode picks the plan: ModeFull, ModeQuick (about a minute) or ModeTiny
	// (seconds; for tests).
	Mode string
	// Sections limits the run ("checkpoint", "http", "memory"; or
	// "commit" for commit and restore, "release" for release, the two
	// halves of "checkpoint"); nil runs every one.
	Sections []string
	// RepoDir is where git is asked for the commit ("" is the working
	// directory).
	RepoDir string
	// Progress receives a line per measured cell (nil discards).
	Progress io.Writer
	// Child builds the command of a child process given its arguments;
	// nil re-runs this executable with ChildEnv set (see Child).
	Child func(args ...string) *exec.Cmd
	// Server starts the owner's HTTP server on a loopback listener for the
	// HTTP section; nil uses DefaultServer.
	Server ServerFunc
	// OnUpdate, when set, receives the report so far each time a cell
	// finishes (to write it out as the run goes). The report is the one
	// Run fills: read it before returning, do not keep it.
	OnUpdate func(*Report)
	// Sessions, Latencies and Parallelism, when set, replace the mode's
	// matrix (to profile one cell); Sessions also picks the release cases
	// of K=1 checkpoint of each N.
	Sessions    []int
	Latencies   []time.Duration
	Parallelism []int

	// SandboxSessions, when set, replaces the mode's N of the sandboxes
	// section.
	SandboxSessions []int
	// SandboxModes, when set, limits the sandboxes section to these fs
	// modes ("copy", "overlay").
	SandboxModes []string

	// breakCell, when set, is asked before each checkpoint cell whether
	// it should fail (tests of a run that goes on past a failed cell).
	breakCell func(CheckpointRow) error
}

// Plan modes.
const (
	ModeFull  = "full"
	ModeQuick = "quick"
	ModeTiny  = "tiny"
)

// Sections.
const (
	SectionCheckpoint = "checkpoint"
	SectionCommit     = "commit"
	SectionRelease    = "release"
	SectionHTTP       = "http"
	SectionMemory     = "memory"
	SectionSandboxes  = "sandboxes"
	SectionScale      = "scale"
)

// plan is what a mode measures.
type plan struct {
	sessions    []int
	latencies   []time.Duration
	parallelism []int
	release     [][2]int // {K checkpoints, N sessions each}
	// budget is the wall time after which a cell stops repeating (it
	// always measures once); maxReps caps the repetitions.
	budget  time.Duration
	maxReps int

	httpClients  []int
	httpDuration time.Duration
	httpWarmup   time.Duration

	memorySessions int
}

func planFor(mode string) (plan, error) {
	p := plan{
		latencies:   []time.Duration{0, 20 * time.Millisecond},
		parallelism: []int{16, 64, 256},
		httpClients: []int{64, 1024},
	}
	switch mode {
	case ModeFull, "":
		p.sessions = []int{1, 10, 100, 1000, 10000}
		// Release stays at K·N ≤ 1,000: the index's Drop grows with the
		// square of the snapshots it tombstones (see README.md).
		p.release = [][2]int{{1, 10}, {1, 100}, {1, 1000}, {10, 100}}
		p.budget, p.maxReps = 1200*time.Millisecond, 11
		p.httpDuration, p.httpWarmup = 4*time.Second, time.Second
		p.memorySessions = 10000
	case ModeQuick:
		p.sessions = []int{1, 10, 100, 1000}
		p.release = [][2]int{{1, 10}, {1, 100}, {10, 10}}
		p.budget, p.maxReps = 400*time.Millisecond, 5
		p.httpDuration, p.httpWarmup = 1500*time.Millisecond, 500*time.Millisecond
		p.memorySessions = 10000
	case ModeTiny:
		p.sessions = []int{1, 10}
		p.latencies = []time.Duration{0, 2 * time.Millisecond}
		p.parallelism = []int{4}
		p.release = [][2]int{{2, 5}}
		p.budget, p.maxReps = 0, 1
		p.httpClients = []int{4}
		p.httpDuration, p.httpWarmup = 300*time.Millisecond, 100*time.Millisecond
		p.memorySessions = 50
	default:
		return p, fmt.Errorf("unknown mode %q (want %s, %s or %s)", mode, ModeFull, ModeQuick, ModeTiny)
	}
	return p, nil
}

type harness struct {
	opts Options
	plan plan
	tmp  string
	// waits maps each latency of the plan to what a fake call of it
	// really waits here (timerWait).
	waits map[time.Duration]time.Duration
	// rep is the report being filled; update changes it and tells
	// Options.OnUpdate.
	rep     *Report
	started time.Time
}

// update applies fn to the report and hands the report so far to
// Options.OnUpdate, so that a run stopped or killed later keeps every cell
// finished before.
func (h *harness) update(fn func(r *Report)) {
	fn(h.rep)
	if h.opts.OnUpdate != nil {
		h.rep.Took = time.Since(h.started)
		h.rep.Machine.LoadEnd = LoadAverage()
		h.opts.OnUpdate(h.rep)
	}
}

// fail records that a whole section could not run, and goes on.
func (h *harness) fail(section string, err error) {
	fmt.Fprintf(h.opts.Progress, "%s: failed: %v\n", section, err)
	h.update(func(r *Report) { r.Failed[section] = oneLine(err.Error()) })
}

// Run measures what opts ask for and returns the report. A cell that fails
// is reported as failed (its row carries the error) and the run goes on; a
// section that cannot start is in Report.Failed, or in Report.Skipped when
// it cannot run here at all (the HTTP server is not built). Only a bad
// option or a cancelled ctx is an error.
func Run(ctx context.Context, opts Options) (*Report, error) {
	p, err := planFor(opts.Mode)
	if err != nil {
		return nil, err
	}
	if opts.Mode == "" {
		opts.Mode = ModeFull
	}
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	if opts.Child == nil {
		opts.Child = selfChild
	}
	if opts.Server == nil {
		opts.Server = DefaultServer
	}
	tmp, err := os.MkdirTemp("", "owner-bench-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	if len(opts.Sessions) > 0 {
		p.sessions, p.release = opts.Sessions, nil
		for _, n := range opts.Sessions {
			p.release = append(p.release, [2]int{1, n})
		}
	}
	if len(opts.Latencies) > 0 {
		p.latencies = opts.Latencies
	}
	if len(opts.Parallelism) > 0 {
		p.parallelism = opts.Parallelism
	}
	h := &harness{opts: opts, plan: p, tmp: tmp, started: time.Now(),
		rep: &Report{Mode: opts.Mode, Machine: DescribeMachine(opts.RepoDir), Skipped: map[string]string{}, Failed: map[string]string{}, Partial: true}}
	h.checkpoints(ctx)
	if h.wants(SectionMemory) && ctx.Err() == nil {
		if m, err := h.memory(ctx); err != nil {
			h.fail(SectionMemory, err)
		} else {
			h.update(func(r *Report) { r.Memory = m })
		}
	}
	if h.wants(SectionSandboxes) && ctx.Err() == nil {
		if sb, err := h.sandboxes(ctx); err != nil {
			h.fail(SectionSandboxes, err)
		} else {
			h.update(func(r *Report) { r.Sandboxes = sb })
		}
	}
	if h.wants(SectionScale) && ctx.Err() == nil {
		if sc, err := h.scale(ctx); err != nil {
			h.fail(SectionScale, err)
		} else {
			h.update(func(r *Report) { r.Scale = sc })
		}
	}
	if h.wants(SectionHTTP) && ctx.Err() == nil {
		var skip *SkipError
		switch err := h.http(ctx); {
		case errors.As(err, &skip):
			fmt.Fprintf(h.opts.Progress, "http: skipped: %s\n", skip.Reason)
			h.update(func(r *Report) { r.Skipped[SectionHTTP] = skip.Reason })
		case err != nil && ctx.Err() == nil:
			h.fail(SectionHTTP, err)
		}
	}
	h.update(func(r *Report) { r.Partial = ctx.Err() != nil })
	rep := h.rep
	rep.Took = time.Since(h.started)
	rep.Machine.LoadEnd = LoadAverage()
	return rep, ctx.Err()
}

// SkipError says a section could not run here, and why.
type SkipError struct{ Reason string }

func (e *SkipError) Error() string { return "skipped: " + e.Reason }

func (h *harness) wants(section string) bool {
	return len(h.opts.Sections) == 0 || slices.Contains(h.opts.Sections, section)
}

// checkpoints runs the commit, restore and release matrices and the phases
// of the goal cell, adding each row as its cell finishes.
func (h *harness) checkpoints(ctx context.Context) {
	all := h.wants(SectionCheckpoint)
	if !all && !h.wants(SectionCommit) && !h.wants(SectionRelease) {
		return
	}
	h.waits = map[time.Duration]time.Duration{}
	for _, l := range h.plan.latencies {
		h.waits[l] = timerWait(l)
		if l > 0 {
			fmt.Fprintf(h.opts.Progress, "a %s timer waits %s here\n", fmtDur(l), fmtDur(h.waits[l]))
		}
	}
	h.update(func(r *Report) { r.Waits = h.waits })
	if cost, err := fakeCost(ctx, 1000); err != nil {
		h.fail("fake cost", err)
	} else {
		h.update(func(r *Report) { r.FakeCost = cost })
		fmt.Fprintf(h.opts.Progress, "the fake's own cost per call: snapshot %s, fork %s, delete %s\n",
			fmtDur(cost[fake.OpSnapshot]), fmtDur(cost[fake.OpFork]), fmtDur(cost[fake.OpDeleteSnapshot]))
	}
	if all || h.wants(SectionCommit) {
		for _, n := range h.plan.sessions {
			for _, par := range h.plan.parallelism {
				if ctx.Err() != nil {
					return
				}
				h.commitAndRestore(ctx, n, par)
			}
		}
		if ctx.Err() != nil {
			return
		}
		ph, err := h.phases(ctx)
		if err != nil {
			h.fail("phases", err)
		} else {
			h.update(func(r *Report) { r.Phases = ph })
			for _, x := range append(append([]Phase(nil), ph.Commit...), ph.Restore...) {
				fmt.Fprintf(h.opts.Progress, "phases: %-60s %s\n", x.Name, fmtDur(x.Took))
			}
		}
	}
	if all || h.wants(SectionRelease) {
		for _, kn := range h.plan.release {
			for _, par := range h.plan.parallelism {
				if ctx.Err() != nil {
					return
				}
				h.release(ctx, kn[0], kn[1], par)
			}
		}
	}
}

// add puts a finished checkpoint row in the report.
func (h *harness) add(row CheckpointRow) {
	h.progress(row)
	h.update(func(r *Report) {
		switch row.Op {
		case OpCommit:
			r.Commit = append(r.Commit, row)
		case OpRestore:
			r.Restore = append(r.Restore, row)
		case OpRelease:
			r.Release = append(r.Release, row)
		}
	})
}

func (h *harness) progress(r CheckpointRow) {
	fmt.Fprintf(h.opts.Progress, "%-7s N=%-5d K=%-2d L=%-7s P=%-3d reps=%-2d measured %-9s ideal %-9s (index %-8s) ratio %.3f, to floor %.3f, load %s %s\n",
		r.Op, r.Sessions, r.Checkpoints, fmtDur(r.Latency), r.Parallelism, r.Reps,
		fmtDur(r.Measured), fmtDur(r.Ideal()), fmtDur(r.Index), r.Ratio(), r.FloorRatio(), r.Load, r.Flag())
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
