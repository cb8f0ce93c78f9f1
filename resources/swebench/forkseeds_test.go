package swebench

import (
	"context"
	"testing"
)

// TestForkSeedsSetUpAnInstanceOnce: with fork_seeds, two sessions of one
// instance run its setup once: both are forks of one template, with the
// same session data, each its own sandbox (what one agent writes the other
// does not see); without it each seed runs its own setup.
func TestForkSeedsSetUpAnInstanceOnce(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	w := newWorld(t, tk, withConfig(func(c *Config) { c.ForkSeeds = true }))
	row := tk.row("example__calc-1")
	a, b := w.seed("s-fork-a", row), w.seed("s-fork-b", row)
	if got := w.own.TemplateSetups(); got != 1 {
		t.Fatalf("setups into templates = %d, want 1", got)
	}
	if *a.SandboxHandle == *b.SandboxHandle {
		t.Fatalf("both sessions got sandbox %s", *a.SandboxHandle)
	}
	ctx := context.Background()
	sa, err := w.own.RequireSessionSandbox(ctx, "s-fork-a")
	if err != nil {
		t.Fatal(err)
	}
	sb, err := w.own.RequireSessionSandbox(ctx, "s-fork-b")
	if err != nil {
		t.Fatal(err)
	}
	if sa.FromSnapshot == "" || sa.FromSnapshot != sb.FromSnapshot || string(sa.Data) != string(sb.Data) {
		t.Fatalf("forks of %q and %q, data %s and %s", sa.FromSnapshot, sb.FromSnapshot, sa.Data, sb.Data)
	}
	if d, err := ParseSessionData(sa.Data); err != nil || d.InstanceID != "example__calc-1" {
		t.Fatalf("session data %s: %v", sa.Data, err)
	}
	w.agentRun(*a.SandboxHandle, "echo mine > only-a.txt")
	if out := w.agentRun(*b.SandboxHandle, "ls only-a.txt 2>&1 || true"); out == "only-a.txt\n" {
		t.Fatal("a file one fork wrote shows in the other")
	}
}
