package harness

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMain hands over to Child when the harness started this test binary as
// one of its children (the load generator, the memory probe).
func TestMain(m *testing.M) {
	if IsChild() {
		os.Exit(Child(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestTinyRun runs every section at toy sizes, the HTTP one against the
// real server (DefaultServer), and checks that the report has its tables and
// files. Figures are not checked: this is so the harness
// cannot rot, not a benchmark.
func TestTinyRun(t *testing.T) {
	// Beside TestRunGoesOnPastFailedCells: each mostly waits (its load
	// windows, children and sandboxes), and no figure is checked.
	t.Parallel()
	var progress bytes.Buffer
	rep, err := Run(context.Background(), Options{Mode: ModeTiny, Progress: &progress})
	if err != nil {
		t.Fatalf("Run: %v\nprogress:\n%s", err, progress.String())
	}
	if len(rep.Commit) != 4 || len(rep.Restore) != 4 || len(rep.Release) != 2 {
		t.Errorf("rows: %d commit, %d restore, %d release; want 4, 4, 2", len(rep.Commit), len(rep.Restore), len(rep.Release))
	}
	for _, row := range append(append(rep.Commit, rep.Restore...), rep.Release...) {
		if row.Reps < 1 || row.Measured <= 0 || row.Index <= 0 {
			t.Errorf("row not measured: %+v", row)
		}
	}
	if len(rep.HTTP) != len(scenarioNames()) {
		t.Errorf("%d HTTP rows, want %d (skipped: %v)", len(rep.HTTP), len(scenarioNames()), rep.Skipped)
	}
	for _, row := range rep.HTTP {
		if row.Server.Iterations == 0 || row.Bare.Iterations == 0 || row.BareAfter.Iterations == 0 || row.Server.Errors > 0 || row.Load == "" {
			t.Errorf("HTTP row %s C=%d: %+v", row.Route, row.Clients, row)
		}
	}
	if rep.Memory == nil || rep.Memory.Owner.Sessions != 50 || rep.Memory.Owner.RSSAfter == 0 {
		t.Errorf("memory: %+v", rep.Memory)
	}

	if sb := rep.Sandboxes; sb == nil {
		t.Error("no sandboxes section")
	} else {
		modes := map[string]int{}
		for _, r := range sb.Rows {
			modes[modeName(r.Mode)]++
			if r.Err != "" || r.Wall <= 0 || r.Bytes <= 0 && (r.Op == OpCommit || r.Mode == "off") {
				t.Errorf("sandboxes row not measured: %+v", r)
			}
			if r.Op == OpCommit && len(r.Pauses) != r.Sessions {
				t.Errorf("%s commit of %d: %d pauses, want one per sandbox", modeName(r.Mode), r.Sessions, len(r.Pauses))
			}
		}
		if modes["copy"] != 4 || modes["overlay"] != 4 && sb.Skipped["overlay"] == "" {
			t.Errorf("sandboxes rows by mode %v (skipped %v), want 4 of each mode that runs here", modes, sb.Skipped)
		}
	}
	if sc := rep.Scale; sc == nil || sc.Errors != 0 || sc.Verified != sc.Sessions || sc.Routes[scaleAppend].Iterations == 0 || sc.Control[scaleRestore] <= 0 {
		t.Errorf("scale: %+v", sc)
	}
	md := rep.Markdown()
	for _, want := range []string{
		"## Machine", "## Goals", "## Commit", "## Restore", "## Where the time goes", "## Release", "## HTTP", "## Real sandboxes", "## 40 sessions over HTTP", "## Memory", "## Chart",
		"| N | L | P | reps | measured | best | worst | ideal |", "| K | N | deletes |", "| route | C | req/s |",
		"| /sandbox_access | 4 |", "| seed+close | 4 |", "the owner's share", "| commit |", "spread by more than 50% (worst against best)",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the report has no %q", want)
		}
	}
	dir := t.TempDir()
	if err := rep.Write(dir); err != nil {
		t.Fatal(err)
	}
	svg, err := os.ReadFile(filepath.Join(dir, chartFile))
	if err != nil || !bytes.HasPrefix(svg, []byte("<svg")) || !bytes.Contains(svg, []byte("<polyline")) {
		t.Errorf("chart: %v, %.80q", err, svg)
	}
	for _, want := range []string{"sessions N (log scale)", "wall time of the operation (log scale)", "commit " + rep.Machine.Commit, rep.Machine.Date.Format("2006-01-02"), rep.Machine.CPU} {
		if !bytes.Contains(svg, []byte(xmlEscape(want))) {
			t.Errorf("the chart does not carry %q", want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, resultsFile)); err != nil || string(b) != md {
		t.Errorf("results.md: %v", err)
	}
}

// TestHTTPSkippedWithoutServer: a server that cannot run here skips the
// HTTP section with a reason instead of failing the run.
func TestHTTPSkippedWithoutServer(t *testing.T) {
	rep, err := Run(context.Background(), Options{Mode: ModeTiny, Sections: []string{SectionHTTP},
		Server: func(context.Context, string) (Target, error) { return Target{}, &SkipError{Reason: "no server here"} }})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Skipped[SectionHTTP] != "no server here" || len(rep.Commit) > 0 {
		t.Fatalf("skipped %v, %d commit rows", rep.Skipped, len(rep.Commit))
	}
	if md := rep.Markdown(); !strings.Contains(md, "Skipped: no server here") {
		t.Errorf("the report does not say why HTTP was skipped:\n%s", md)
	}
}

func TestChildRejectsBadArguments(t *testing.T) {
	var out, errs bytes.Buffer
	for _, args := range [][]string{nil, {"nope"}, {"load", "-clients", "0"}, {"memory", "-what", "nothing"}, {"load", "-bogus"}} {
		out.Reset()
		errs.Reset()
		if code := Child(args, &out, &errs); code == 0 {
			t.Errorf("Child(%q) = 0, want a failure", args)
		}
	}
}

func TestDecadeLabel(t *testing.T) {
	for e, want := range map[float64]string{-6: "1µs", -5: "10µs", -3: "1ms", -1: "100ms", 0: "1s", 2: "100s"} {
		if got := decadeLabel(e); got != want {
			t.Errorf("decadeLabel(%v) = %q, want %q", e, got, want)
		}
	}
}
