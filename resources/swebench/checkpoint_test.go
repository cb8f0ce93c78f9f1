package swebench

import (
	"context"
	"strings"
	"testing"

	"github.com/sandboxowner/owner/owner"
)

func TestCommitCrashRestoreAndVerifyGradesTheCheckpointedWork(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	w := newWorld(t, tk)
	row := tk.row("example__calc-1")
	seed := w.seed("s-ckpt", row)
	old := *seed.SandboxHandle
	// The agent fixes the bug (uncommitted) and adds a file of its own.
	w.applyAsAgent(old, tk.patch)
	w.agentRun(old, "echo 'work in progress' > PLAN.md")

	res, err := w.own.Commit(context.Background(), owner.CommitRequest{CheckpointID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Sessions) != 1 || res.Sessions[0] != "s-ckpt" {
		t.Fatalf("commit exported %v", res.Sessions)
	}
	// The exported state: the sandbox, the workdir, the session data.
	ck, err := w.own.Index().Checkpoint("c1")
	if err != nil {
		t.Fatal(err)
	}
	rec := ck.Records[0]
	d, err := ParseSessionData(rec.Data)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Sandbox.SandboxID != old || rec.SnapshotID == "" || rec.Workdir != "/testbed" || d.BaseCommit != tk.base || d.PristineUntracked == nil {
		t.Fatalf("record: sandbox %s snapshot %q workdir %q data %+v", rec.Sandbox.SandboxID, rec.SnapshotID, rec.Workdir, d)
	}
	// Drift after the checkpoint, which a restore must not bring back.
	w.agentRun(old, "echo 'func broken(' >> calc.go && rm PLAN.md")

	w.crash()
	if _, err := w.own.Restore(context.Background(), owner.RestoreRequest{CheckpointID: "c1"}); err != nil {
		t.Fatal(err)
	}
	again := w.seed("s-ckpt", row)
	if !again.Restored || again.SandboxHandle == nil || *again.SandboxHandle == old || again.Workdir != "/testbed" {
		t.Fatalf("re-seed after restore: %+v (old sandbox %s)", again, old)
	}
	fork := *again.SandboxHandle
	if got := w.agentRun(fork, "cat PLAN.md && git rev-parse HEAD && git for-each-ref --format='%(refname)'"); got != "work in progress\n"+tk.base+"\nrefs/heads/"+WorkBranch+"\n" {
		t.Errorf("the fork holds:\n%s", got)
	}
	res2 := w.verify("s-ckpt", row)
	wantResolved(t, res2)
	if !strings.Contains(*res2.ModelPatch, "PLAN.md") || strings.Contains(*res2.ModelPatch, "broken") {
		t.Errorf("the graded patch is not the checkpointed work:\n%s", *res2.ModelPatch)
	}
	if live := w.liveSandboxes(); len(live) != 0 {
		t.Errorf("sandboxes running after verify (the superseded one, the fork, the grader?): %v", live)
	}
}
