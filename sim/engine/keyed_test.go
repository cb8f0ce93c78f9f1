package engine

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/owner"
)

// TestKeyedSeeds replays runs with the keyed workload: groups of seeds of
// one key (a failing setup among them, crashes mid-build), templates
// expiring, warm pools; none may violate an invariant, and together they
// reach what the workload is for.
func TestKeyedSeeds(t *testing.T) {
	var traces bytes.Buffer
	for seed := int64(1); seed <= 40; seed++ {
		var tr bytes.Buffer
		res := Run(seed, Config{Sessions: 4, Steps: 40, Faults: DefaultFaults(), TempDir: t.TempDir(), Keyed: true, Trace: &tr})
		for _, v := range res.Violations {
			t.Errorf("%s\n  replay: go run ./sim -seed %d -runs 1 -keyed -v", v, seed)
		}
		traces.Write(tr.Bytes())
	}
	all := traces.String()
	for what, re := range map[string]string{
		"a group seeding one key at once":            `keyed seed of k\d by \[s\d s\d.*setups 1`,
		"a failing setup failing its group":          `keyed seed of k\d by \[s\d s\d.*setup fails true.*setup failed on purpose.*setup failed on purpose`,
		"a crash in a keyed seed":                    `keyed seed .*crash true`,
		"a build cut by a crash, cleaned at startup": `a template's build did not finish`,
		"templates expiring while forks stand":       `expire templates .*deferred \[snap`,
	} {
		if !regexp.MustCompile(re).MatchString(all) {
			t.Errorf("no run reached %s (%s)", what, re)
		}
	}
}

// runKeyedSabotaged runs a keyed seed with sabotage after every step.
func runKeyedSabotaged(t *testing.T, seed int64, sabotage func(r *run)) []Violation {
	t.Helper()
	r := newRun(seed, Config{Sessions: 4, Steps: 30, TempDir: t.TempDir(), Keyed: true})
	r.sabotage = sabotage
	return r.exec().Violations
}

// The keyed checks read the real state: a pooled sandbox gone behind the
// pool's back, one lent before found in a pool, a template's record lost,
// each shows as its invariant.
func TestKeyedChecksSeeWhatTheOwnerDidNot(t *testing.T) {
	pooled := func(r *run) string {
		if r.o == nil {
			return ""
		}
		held := map[string]bool{}
		for _, sid := range r.m.live() {
			if sb, err := r.o.RequireSessionSandbox(r.life, sid); err == nil {
				held[sb.Handle.SandboxID] = true
			}
		}
		for _, id := range r.fk.LiveSandboxIDs() {
			info, _ := r.fk.Sandbox(id)
			if _, lent := r.lent[id]; !lent && !held[id] && info.Metadata[owner.LabelPool] != "" && info.Metadata[owner.LabelIncarnation] == r.o.Incarnation() {
				return id
			}
		}
		return ""
	}
	for name, tc := range map[string]struct {
		sabotage func(r *run) bool
		want     Invariant
	}{
		"a pooled sandbox stopped behind the pool's back": {func(r *run) bool {
			id := pooled(r)
			if id != "" {
				info, _ := r.fk.Sandbox(id)
				if err := r.fk.Stop(context.Background(), info.Handle); err != nil {
					t.Fatal(err)
				}
			}
			return id != ""
		}, NoLeak},
		"a lent sandbox back in a pool": {func(r *run) bool {
			id := pooled(r)
			if id != "" {
				r.lent[id] = "s9"
			}
			return id != ""
		}, LentOnce},
		"a template's record lost": {func(r *run) bool {
			if r.o == nil {
				return false
			}
			ts, _ := r.o.Index().Templates()
			if len(ts) > 0 {
				_ = r.o.Index().DropTemplates([]string{ts[0].Key}, nil)
			}
			return len(ts) > 0
		}, NoLeak},
	} {
		t.Run(name, func(t *testing.T) {
			done, at := false, 0
			vs := runKeyedSabotaged(t, 3, func(r *run) {
				if !done && tc.sabotage(r) {
					done, at = true, r.step
				}
			})
			if !done {
				t.Fatal("the run never reached the sabotage")
			}
			if diff := cmp.Diff([]Invariant{tc.want}, invariantsOf(vs)); diff != "" || vs[0].Step != at {
				t.Fatalf("sabotaged at step %d; violations %v (-want +got):\n%s", at, vs, diff)
			}
		})
	}
}

// Without the keyed workload the report has no rows of its invariants;
// with it, or with a violation of one, it does.
func TestKeyedReportRows(t *testing.T) {
	for _, tc := range []struct {
		keyed bool
		vs    []Violation
		want  bool
	}{
		{false, nil, false},
		{true, nil, true},
		{false, []Violation{{Invariant: LentOnce}}, true},
	} {
		s := NewSummary()
		s.Add(Result{Violations: tc.vs})
		var b strings.Builder
		s.WriteTable(&b, Config{Keyed: tc.keyed, Faults: Faults{}}, func(int64) string { return "" })
		if got := strings.Contains(b.String(), string(LentOnce)); got != tc.want {
			t.Errorf("keyed %v, violations %v: row %v, want %v\n%s", tc.keyed, tc.vs, got, tc.want, b.String())
		}
	}
}
