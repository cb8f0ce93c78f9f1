package swebench

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/resources/swebench/grading"
	"github.com/sandboxowner/owner/sandbox"
)

func wantResolved(t *testing.T, res VerifyResult) {
	t.Helper()
	if res.Reward != 1 || !res.Resolved || !res.EvaluationCompleted {
		t.Fatalf("want reward 1.0, resolved and completed; got:\n%s", describe(res))
	}
	want := &grading.TestsStatus{
		FailToPass: grading.TestResults{Success: failToPass, Failure: []string{}},
		PassToPass: grading.TestResults{Success: passToPass, Failure: []string{}},
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
	t.Parallel()
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
			if _, ok := w.own.SessionSandbox(context.Background(), sid); ok {
				t.Error("the agent's session still holds a sandbox after verify")
			}
			if live := w.liveSandboxes(); len(live) != 0 {
				t.Errorf("sandboxes left running after verify: %v", live)
			}
		})
	}
}

func TestVerifyWithoutASandboxIsRefused(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	w := newWorld(t, tk)
	_, err := w.srv.VerifySession(context.Background(), w.own, "never-seeded", mustJSON(t, tk.row("example__calc-1")))
	if !errors.Is(err, sandbox.ErrNone) {
		t.Fatalf("err = %v, want sandbox.ErrNone", err)
	}
}

func TestChangesThatDoNotFixTheBugDoNotResolve(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	w := newWorld(t, tk)
	wrongCalc := strings.Replace(buggyCalc, "\t\treturn x\n\t}", "\t\treturn x + 1\n\t}", 1)
	brokenCalc := strings.Replace(fixedCalc, "return -x", "return -x +", 1)
	// The agent rewrites the tests so that they pass against the buggy
	// Abs: the test patch overrides both files.
	cheatTests := "package calc\n\nimport \"testing\"\n\nfunc TestAbs(t *testing.T) {\n\tt.Run(\"positive\", func(t *testing.T) {})\n\tt.Run(\"negative\", func(t *testing.T) {})\n}\n"
	cases := []struct {
		name  string
		agent string // shell run by the agent in /testbed
		check func(t *testing.T, res VerifyResult)
	}{
		{"no change", "true", func(t *testing.T, res VerifyResult) {
			if res.PatchSource != "none" || *res.ModelPatch != "" || !res.EvaluationCompleted {
				t.Errorf("no change: source %q patch %q completed %v", res.PatchSource, *res.ModelPatch, res.EvaluationCompleted)
			}
			if d := cmp.Diff([]string{"TestAbs", "TestAbs/negative"}, res.TestsStatus.FailToPass.Failure); d != "" {
				t.Errorf("FAIL_TO_PASS failures (-want +got):\n%s", d)
			}
		}},
		{"wrong change", "cat > calc.go <<'EOF'\n" + wrongCalc + "EOF\n", func(t *testing.T, res VerifyResult) {
			if !res.EvaluationCompleted || !strings.Contains(res.TestOutput, "--- FAIL: TestAbs/negative") {
				t.Errorf("wrong change: completed %v, output:\n%s", res.EvaluationCompleted, res.TestOutput)
			}
		}},
		{"patch that breaks the build", "cat > calc.go <<'EOF'\n" + brokenCalc + "EOF\n", func(t *testing.T, res VerifyResult) {
			if !strings.Contains(res.TestOutput, "FAIL") || res.TestsStatus == nil || len(res.TestsStatus.PassToPass.Success) != 0 {
				t.Errorf("broken build: every test is missing, so a failure; got:\n%s", describe(res))
			}
		}},
		{"patch that rewrites the tests", "cat > abs_test.go <<'EOF'\n" + cheatTests + "EOF\nprintf '\\nfunc TestAddZero(t *testing.T) {}\\n' >> calc_test.go\n", func(t *testing.T, res VerifyResult) {
			if !strings.Contains(*res.ModelPatch, "abs_test.go") || !strings.Contains(*res.ModelPatch, "calc_test.go") {
				t.Fatalf("the model patch should carry the rewritten tests:\n%s", *res.ModelPatch)
			}
			if !strings.Contains(res.TestOutput, "Abs(-3) = -3") {
				t.Errorf("the test patch's tests did not run:\n%s", res.TestOutput)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // sessions of their own
			w := w.in(t)
			row := tk.row("example__calc-1")
			sid := "s-" + strings.ReplaceAll(c.name, " ", "-")
			seed := w.seed(sid, row)
			w.agentRun(*seed.SandboxHandle, c.agent)
			res := w.verify(sid, row)
			wantUnresolved(t, res)
			c.check(t, res)
		})
	}
}

func TestUnisolatedSandboxesGradeTheMultilingualScript(t *testing.T) {
	t.Parallel()
	// Unisolated, the tree is not at /testbed: the row's eval script
	// (which does cd /testbed) is pointed at the sandbox's directory.
	tk := newTask(t)
	w := newWorld(t, tk, unisolated())
	if w.prov.Isolation() != "none" {
		t.Fatalf("isolation %s", w.prov.Isolation())
	}
	row := tk.multilingualRow("example__calc-1")
	seed := w.seed("s-unisolated", row)
	w.applyAsAgent(*seed.SandboxHandle, tk.patch)
	wantResolved(t, w.verify("s-unisolated", row))
}

func TestAnAgentThatBreaksGitGetsAnEmptyPatch(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	w := newWorld(t, tk)
	row := tk.row("example__calc-1")
	seed := w.seed("s-nogit", row)
	w.applyAsAgent(*seed.SandboxHandle, tk.patch)
	w.agentRun(*seed.SandboxHandle, "rm -rf .git")
	res := w.verify("s-nogit", row)
	wantUnresolved(t, res)
	if *res.ModelPatch != "" || res.PatchSource != "none" || !strings.Contains(res.FailureReason, "extraction") {
		t.Errorf("patch %q source %q reason %q", *res.ModelPatch, res.PatchSource, res.FailureReason)
	}
	if live := w.liveSandboxes(); len(live) != 0 {
		t.Errorf("sandboxes left: %v", live)
	}
}

func TestCommittedWorkOnABranchTheAgentLeft(t *testing.T) {
	t.Parallel()
	// The agent commits the fix on a branch of its own and goes back to the
	// work branch: the work tree shows nothing, so the patch is the most
	// advanced branch's.
	tk := newTask(t)
	w := newWorld(t, tk)
	seed := w.seed("s-branch", tk.row("example__calc-1"))
	sb := *seed.SandboxHandle
	w.agentRun(sb, "git checkout -q -b attempt")
	w.applyAsAgent(sb, tk.patch)
	w.agentRun(sb, "git commit -q -am one && echo '// two' >> calc.go && git commit -q -am two && git checkout -q "+WorkBranch)
	ex := w.extract("s-branch", false)
	if ex.Source != "committed" || ex.Commits != 2 || ex.WorktreeDirty || !strings.Contains(ex.Patch, "return -x") || !strings.Contains(ex.Patch, "// two") {
		t.Errorf("extraction: %+v\n%s", ex, ex.Patch)
	}
	// The extraction left the agent's index alone.
	if got := w.agentRun(sb, "git status --porcelain"); got != "" {
		t.Errorf("git status after the extraction: %q", got)
	}
}
