package swebench

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/owner"
)

func wantResolved(t *testing.T, res VerifyResult) {
	t.Helper()
	if res.Reward != 1 || !res.Resolved || !res.EvaluationCompleted {
		t.Fatalf("want reward 1.0, resolved and completed; got:\n%s", describe(res))
	}
	want := &TestsStatus{
		FailToPass: TestResults{Success: failToPass, Failure: []string{}},
		PassToPass: TestResults{Success: passToPass, Failure: []string{}},
	}
	if d := cmp.Diff(want, res.TestsStatus); d != "" {
		t.Errorf("tests_status (-want +got):\n%s", d)
	}
}

func wantUnresolved(t *testing.T, res VerifyResult) {
	t.Helper()
	if res.Reward != 0 || res.Resolved {
		t.Fatalf("want reward 0.0, unresolved; got:\n%s", describe(res))
	}
	if res.MaskSample {
		t.Errorf("an unresolved sample is masked (grading failed?):\n%s", describe(res))
	}
}

func TestGoldPatchAppliedByTheAgentResolves(t *testing.T) {
	tk := newTask(t)
	w := newWorld(t, tk)
	for _, format := range []string{"original", "multilingual"} {
		t.Run(format, func(t *testing.T) {
			row := tk.row("example__calc-1")
			if format == "multilingual" {
				row = tk.multilingualRow("example__calc-1")
			}
			sid := "s-gold-" + format
			seed := w.seed(sid, row)
			if seed.SandboxHandle == nil || seed.Workdir != "/testbed" {
				t.Fatalf("seed = %+v", seed)
			}
			sbID := *seed.SandboxHandle
			w.applyAsAgent(sbID, tk.patch)
			// Committed work counts as much as uncommitted work.
			w.agentRun(sbID, "git commit -q -am 'fix Abs'")
			res := w.verify(sid, row)
			wantResolved(t, res)
			if res.PatchSource != "worktree" || res.PatchCommits != 1 || res.ModelPatch == nil || !strings.Contains(*res.ModelPatch, "return -x") {
				t.Errorf("patch provenance: source %q commits %d patch %v", res.PatchSource, res.PatchCommits, res.ModelPatch)
			}
			if !strings.Contains(res.TestOutput, "--- PASS: TestAbs") {
				t.Errorf("test_output lacks the tests:\n%s", res.TestOutput)
			}
			if _, ok := w.own.SessionSandbox(sid); ok {
				t.Error("the agent's session still holds a sandbox after verify")
			}
			if live := w.liveSandboxes(); len(live) != 0 {
				t.Errorf("sandboxes left running after verify: %v", live)
			}
		})
	}
}

func TestVerifyWithoutASandboxIsRefused(t *testing.T) {
	tk := newTask(t)
	w := newWorld(t, tk)
	_, err := w.srv.Verify(context.Background(), "never-seeded", mustJSON(t, tk.row("example__calc-1")))
	if !errors.Is(err, owner.ErrNoSessionSandbox) {
		t.Fatalf("err = %v, want owner.ErrNoSessionSandbox", err)
	}
}
