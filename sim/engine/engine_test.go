package engine

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/sandboxapi"
)

// TestRegressionSeeds replays a fixed set of small runs and every seed that
// ever found a bug: none may violate an invariant.
func TestRegressionSeeds(t *testing.T) {
	// Seeds that found bugs (with the default -sessions 4 -steps 40
	// -faults all); each replays the run that found it. The commits that
	// fixed them name the seeds.
	bugSeeds := []int64{
		9,   // startup sweep did not retry a failed stop (owner)
		102, // same, mid-seed crash
		204, // snapshots landing after a round's deadline (harness wait)
		220, // Sessions listed a session after EndSessionSandbox returned (actors)
		284, // a failed setup's failed stop leaked the sandbox (actors)
		319, // snapshots landing after a round's deadline (harness wait)
		340, // a failed restore's rollback stopped a live session's fork (owner)
	}
	small := Config{Sessions: 3, Steps: 16, Faults: DefaultFaults(), TempDir: t.TempDir()}
	// Not cut under -short: a seed replayed to fewer steps may stop short
	// of the step where it found its bug.
	full := Config{Sessions: 4, Steps: 40, Faults: DefaultFaults(), TempDir: t.TempDir()}
	type tc struct {
		seed int64
		cfg  Config
	}
	var cases []tc
	for s := int64(1001); s <= 1030; s++ {
		cases = append(cases, tc{s, small})
	}
	for _, s := range bugSeeds {
		cases = append(cases, tc{s, full})
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("seed-%d", c.seed), func(t *testing.T) {
			t.Parallel()
			res := Run(c.seed, c.cfg)
			for _, v := range res.Violations {
				t.Errorf("%s\n  replay: go run ./sim -seed %d -runs 1 -sessions %d -steps %d -v", v, c.seed, c.cfg.Sessions, c.cfg.Steps)
			}
			if res.Steps == 0 {
				t.Errorf("the run took no step")
			}
		})
	}
}

// runSabotaged runs a seed with sabotage after every step and returns the
// violations.
func runSabotaged(t *testing.T, seed int64, sabotage func(r *run)) []Violation {
	t.Helper()
	r := newRun(seed, Config{Sessions: 3, Steps: 20, TempDir: t.TempDir()})
	r.sabotage = sabotage
	return r.exec().Violations
}

// runOnALiveSandbox runs seed with sabotage applied once, to the sandbox
// of the first live session the owner holds at the first step that has
// one, and returns the violations and that step. A seed with no such step
// fails the test: a sabotage never made checks nothing.
func runOnALiveSandbox(t *testing.T, seed int64, sabotage func(r *run, sb sandbox.Sandbox)) ([]Violation, int) {
	t.Helper()
	done, at := false, 0
	vs := runSabotaged(t, seed, func(r *run) {
		if done || r.o == nil {
			return
		}
		for _, sid := range r.m.live() {
			if sb, err := r.o.RequireSessionSandbox(context.Background(), sid); err == nil {
				sabotage(r, sb)
				done, at = true, r.step
				return
			}
		}
	})
	if !done {
		t.Fatalf("seed %d had no live session to sabotage; pick a seed that has one", seed)
	}
	return vs, at
}

// runSabotagedAt runs seeds with faults until one reaches the sabotage
// point, sabotaging it there (once), and returns that run's violations.
func runSabotagedAt(t *testing.T, faults string, point string, sabotage func(r *run)) []Violation {
	t.Helper()
	f, err := ParseFaults(faults)
	if err != nil {
		t.Fatal(err)
	}
	for seed := int64(1); seed <= 40; seed++ {
		reached := false
		r := newRun(seed, Config{Sessions: 3, Steps: 20, Faults: f, TempDir: t.TempDir()})
		r.sabotageAt = func(r *run, at string) {
			if at == point && !reached {
				reached = true
				sabotage(r)
			}
		}
		vs := r.exec().Violations
		if reached {
			return vs
		}
	}
	t.Fatalf("no seed reached %s", point)
	return nil
}

func invariantsOf(vs []Violation) []Invariant {
	seen := map[Invariant]bool{}
	var out []Invariant
	for _, v := range vs {
		if !seen[v.Invariant] {
			seen[v.Invariant] = true
			out = append(out, v.Invariant)
		}
	}
	return out
}

// The checks read the real state: breaking it behind the owner's back must
// show as the right invariant, at the step it happened.
func TestChecksSeeWhatTheOwnerDidNot(t *testing.T) {
	t.Run("a stray sandbox is a leak", func(t *testing.T) {
		vs := runSabotaged(t, 7, func(r *run) {
			if r.step == 3 {
				if _, err := r.fk.Start(context.Background(), provider.Spec{Image: "stray"}); err != nil {
					t.Fatal(err)
				}
			}
		})
		if diff := cmp.Diff([]Invariant{NoLeak}, invariantsOf(vs)); diff != "" || vs[0].Step != 3 {
			t.Fatalf("violations %v (-want +got):\n%s", vs, diff)
		}
	})
	t.Run("a lost snapshot breaks a checkpoint", func(t *testing.T) {
		done := false
		vs := runSabotaged(t, 11, func(r *run) {
			if done || len(r.m.ckpts) == 0 {
				return
			}
			for _, ck := range r.m.ckpts {
				if len(ck.records) > 0 {
					idx := r.o.Index()
					got, err := idx.Checkpoint(ck.id)
					if err != nil {
						t.Fatal(err)
					}
					if err := r.fk.DeleteSnapshot(context.Background(), got.Records[0].SnapshotID); err != nil {
						t.Fatal(err)
					}
					done = true
					return
				}
			}
		})
		if !done {
			// A sabotage never made checks nothing: the seed must be
			// changed for one that reaches it, not the test skipped.
			t.Fatal("seed 11 made no checkpoint with a record to sabotage; pick a seed that does")
		}
		if diff := cmp.Diff([]Invariant{Restorable}, invariantsOf(vs)); diff != "" {
			t.Fatalf("violations %v (-want +got):\n%s", vs, diff)
		}
	})
	t.Run("notes changed behind the owner are lost state", func(t *testing.T) {
		vs, _ := runOnALiveSandbox(t, 5, func(r *run, sb sandbox.Sandbox) {
			if err := r.fk.WriteFile(context.Background(), sb.Handle, notesFile, []byte("forged\n")); err != nil {
				t.Fatal(err)
			}
		})
		got := invariantsOf(vs)
		if len(got) != 1 || (got[0] != LiveState && got[0] != ExactRestore) {
			t.Fatalf("violations %v, want live state (or exact restore)", vs)
		}
	})
}

// Each invariant the steps check themselves is caught when the state it
// guards is broken at the moment of the check.
func TestStepChecksCatchSabotage(t *testing.T) {
	t.Run("a stray snapshot is a leak", func(t *testing.T) {
		vs, at := runOnALiveSandbox(t, 5, func(r *run, sb sandbox.Sandbox) {
			if _, err := r.fk.Snapshot(context.Background(), sb.Handle, "stray"); err != nil {
				t.Fatal(err)
			}
		})
		// Seen at the step it happened, not only by the final check.
		if diff := cmp.Diff([]Invariant{NoLeak}, invariantsOf(vs)); diff != "" || vs[0].Step != at {
			t.Fatalf("violations %v (-want +got):\n%s", vs, diff)
		}
	})
	t.Run("a fork left by a failed restore breaks all or none", func(t *testing.T) {
		vs := runSabotagedAt(t, "fork-fail=1", atFailedRestore, func(r *run) {
			md := map[string]string{owner.LabelRestore: r.lastRestore, owner.LabelIncarnation: r.o.Incarnation()}
			if _, err := r.fk.Start(context.Background(), provider.Spec{Image: "fork", Metadata: md}); err != nil {
				t.Fatal(err)
			}
		})
		if got := invariantsOf(vs); len(got) == 0 || got[0] != AllOrNone {
			t.Fatalf("violations %v, want all or none first", vs)
		}
	})
	t.Run("a retired episode admitted again is empty grading", func(t *testing.T) {
		vs := runSabotagedAt(t, "none", atRetired, func(r *run) {
			// Its fence lifted behind the control plane's back.
			base := control.Base{CheckpointID: "forged", DeadlineTS: control.UnixSeconds(r.clk.Now().Add(time.Minute))}
			if _, err := r.part.Machine().Forget(context.Background(), control.ForgetRequest{Base: base, RolloutIDs: []string{r.lastRetired.RolloutID}}); err != nil {
				t.Fatal(err)
			}
		})
		if got := invariantsOf(vs); len(got) == 0 || got[0] != NoEmptyGrading {
			t.Fatalf("violations %v, want no empty grading first", vs)
		}
	})
	t.Run("a resent verify that is graded is empty grading", func(t *testing.T) {
		vs := runSabotagedAt(t, "resent-verify=1", atResentVerify, func(r *run) {
			// The ended session gets a sandbox behind the model's back:
			// the resent verify then finds one to grade.
			sid := r.lastVerified
			ran := false
			if _, err := r.o.StartSessionSandbox(context.Background(), sid, r.spec(), notesSetup("forged", false, &ran), ""); err != nil {
				t.Fatal(err)
			}
		})
		if got := invariantsOf(vs); len(got) == 0 || got[0] != NoEmptyGrading {
			t.Fatalf("violations %v, want no empty grading first", vs)
		}
	})
}

// In the deterministic mode one seed is one run: two runs of a seed print
// byte-identical traces, the owner's own log lines, ids and the raced
// steps' interleavings included, whether the run has a worker to itself or
// follows other runs on it (sharing its actor system).
func TestASeedReplaysItsRunExactly(t *testing.T) {
	cfg := Config{Sessions: 4, Steps: 40, Faults: DefaultFaults()}
	trace := func(w *worker, seed int64) string {
		var b bytes.Buffer
		c := cfg
		c.Trace = &b
		w.run(seed, c)
		return b.String()
	}
	seeds := []int64{204, 1, 2, 3, 7, 11, 19, 23, 31, 42, 64, 99, 128, 319, 340, 777}
	if testing.Short() {
		seeds = seeds[:6]
	}
	shared := newWorker()
	var all strings.Builder
	for _, seed := range seeds {
		first := trace(newWorker(), seed)
		second := trace(shared, seed)
		if diff := cmp.Diff(first, second); diff != "" {
			t.Errorf("two runs of seed %d differ (-alone +after other runs on a worker):\n%s", seed, diff)
		}
		all.WriteString(first)
	}
	// The set covers what used to split replays: raced commits, snapshot
	// latency past a deadline, crashes, the control plane with an exec
	// held at its gate and restoring after a crash, and the owner's own
	// warnings.
	for _, want := range []string{"race: commit", "crash", "control checkpoint", "waits at the gate", "control restore of", "level=warning", "snapshot fault \"latency\""} {
		if !strings.Contains(all.String(), want) {
			t.Errorf("no replayed run has %q", want)
		}
	}
}

// In the real-goroutine mode (the owner on goroutines, Badger on disk) runs
// keep every invariant, and a seed replays its steps, faults and
// incarnation ids, though not the interleaving of concurrent calls: with
// only faults that do not depend on it, and the backend's ids normalised,
// the traces agree.
func TestASeedReplaysItsStepsWithRealGoroutines(t *testing.T) {
	faults, err := ParseFaults("crash,lease,drift,resent-verify,setup-fail,crash-seed")
	if err != nil {
		t.Fatal(err)
	}
	ids := regexp.MustCompile(`\b(sb|snap)-[0-9]+`)
	trace := func(seed int64) string {
		var b bytes.Buffer
		res := Run(seed, Config{Sessions: 3, Steps: 30, Faults: faults, Trace: &b, TempDir: t.TempDir(), Runtime: RuntimeReal})
		for _, v := range res.Violations {
			t.Errorf("%s\n  replay: go run ./sim -mode %s -seed %d -runs 1 -sessions 3 -steps 30 -faults %s -v", v, RuntimeReal, seed, faults)
		}
		var keep []string
		for _, line := range strings.Split(b.String(), "\n") {
			// The owner's own log lines come from its goroutines, in
			// any order. Incarnation ids come from the seed: they stay.
			if !strings.HasPrefix(line, "level=") {
				keep = append(keep, ids.ReplaceAllString(line, "$1-N"))
			}
		}
		return strings.Join(keep, "\n")
	}
	for _, seed := range []int64{42, 7} {
		first, second := trace(seed), trace(seed)
		if diff := cmp.Diff(first, second); diff != "" {
			t.Errorf("two runs of seed %d differ (-first +second):\n%s", seed, diff)
		}
	}
}

func TestParseFaults(t *testing.T) {
	f, err := ParseFaults("crash=0.5,race")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Faults{FaultCrash: 0.5, FaultRace: defaultRates()[FaultRace]}, f); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
	all, err := ParseFaults("all,crash=0")
	if err != nil {
		t.Fatal(err)
	}
	if _, on := all[FaultCrash]; on || len(all) != len(Kinds())-1 {
		t.Fatalf("all,crash=0 gave %v", all)
	}
	if f.String() != "crash=0.5,race=0.12" || DefaultFaults().String() != "all" {
		t.Fatalf("String: %q, %q", f.String(), DefaultFaults().String())
	}
	for _, bad := range []string{"nosuch", "crash=2", "crash=x"} {
		if _, err := ParseFaults(bad); err == nil {
			t.Errorf("ParseFaults(%q) accepted it", bad)
		}
	}
}

// TestLostSandboxFaultIsRefused: with every verify meeting a sandbox deleted
// behind the owner's back, the fault fires and no run grades one (the
// no-empty-grading invariant checks its tool call and its verify).
func TestLostSandboxFaultIsRefused(t *testing.T) {
	firesWithoutViolations(t, FaultLost)
}

// A seed whose start fails after the provider made its sandbox fails and
// leaves nothing running (the no-leak check after its step): at rate 1
// every seed of a session without a sandbox arms it.
func TestStartFailingAfterItsEffectLeavesNoSandbox(t *testing.T) {
	firesWithoutViolations(t, FaultStartFailAfter)
}

// firesWithoutViolations runs seeds 1 to 6 (three sessions, 24 steps) with
// fault alone at rate 1: no seed may break an invariant, and the fault must
// fire at least once, or the seeds said nothing of it.
func firesWithoutViolations(t *testing.T, fault Fault) {
	t.Helper()
	fired := 0
	for seed := int64(1); seed <= 6; seed++ {
		res := Run(seed, Config{Sessions: 3, Steps: 24, Faults: Faults{fault: 1}, TempDir: t.TempDir()})
		for _, v := range res.Violations {
			t.Errorf("seed %d: %s", seed, v)
		}
		fired += res.Fired[fault]
	}
	if fired == 0 {
		t.Fatalf("the %s fault never fired", fault)
	}
}

// A sandbox API that resolves every sandbox as live lets an agent's exec
// reach a sandbox its session no longer holds: the stale access check
// must see it.
func TestStaleAccessCheckCatchesAnOpenFence(t *testing.T) {
	open := func(r *run) sandboxapi.Resolver {
		return func(id string) (provider.Handle, sandbox.Fate) {
			return provider.Handle{Provider: r.fk.Name(), SandboxID: id}, sandbox.FateLive
		}
	}
	for seed := int64(1); seed <= 60; seed++ {
		r := newRun(seed, Config{Sessions: 3, Steps: 30})
		r.sabotageResolve = open
		vs := r.exec().Violations
		if slices.Contains(invariantsOf(vs), StaleAccess) {
			return
		}
		if len(vs) > 0 {
			t.Fatalf("seed %d: the open fence showed as %v, not %s", seed, vs, StaleAccess)
		}
	}
	t.Fatal("no seed of 60 caught an agent's exec in a stale sandbox")
}
