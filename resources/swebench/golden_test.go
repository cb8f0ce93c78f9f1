package swebench

import (
	"context"
	"errors"
	"testing"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider/local"
)

// newGolden is the golden-patch instance: its owner has no provider (with
// checkpointing on, no state_dir and 8 workers, the mode in effect is
// restart_only) and grading runs on a local provider of its own.
func newGolden(t *testing.T, tk task) (*local.Provider, *owner.Owner, *Server) {
	t.Helper()
	needTools(t, "git", "go", "patch")
	log := testLogger(t)
	prov, err := local.New(local.Options{Root: t.TempDir(), Logger: log, Caches: sharedCaches(testCachesDir())})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		IsVerifyingGoldenPatch: true,
		Repos:                  map[string]string{taskRepo: tk.dir},
		TemplateDir:            t.TempDir(),
		TestCommands:           map[string]string{taskRepo: goTestCmd},
	}
	if cfg.LendsSandboxes() {
		t.Fatal("the golden-patch instance lends sandboxes")
	}
	own, err := owner.New(context.Background(), owner.Config{
		Name: "swebench_golden", Logger: log, NumWorkers: 8,
		Checkpoint: owner.CheckpointConfig{Enabled: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = own.Close() })
	if own.Mode() != owner.ModeRestartOnly {
		t.Fatalf("mode %s, want restart_only", own.Mode())
	}
	srv, err := New(cfg, Deps{Name: "swebench_golden", Grader: prov, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	return prov, own, srv
}

func TestGoldenPatchInstanceResolvesAndLendsNothing(t *testing.T) {
	tk := newTask(t)
	prov, own, srv := newGolden(t, tk)
	for _, format := range []string{"original", "multilingual"} {
		t.Run(format, func(t *testing.T) {
			row := tk.row("example__calc-1")
			if format == "multilingual" {
				row = tk.multilingualRow("example__calc-1")
			}
			sid := "golden-" + format
			seed, err := srv.SeedSession(context.Background(), own, sid, mustJSON(t, row))
			if err != nil {
				t.Fatal(err)
			}
			if seed.SandboxHandle != nil {
				t.Errorf("the golden seed lent sandbox %s", *seed.SandboxHandle)
			}
			if _, err := own.RequireSessionSandbox(sid); !errors.Is(err, owner.ErrNoSessionSandbox) {
				t.Errorf("RequireSessionSandbox = %v, want ErrNoSessionSandbox (so /sandbox_access is 404)", err)
			}
			res, err := srv.VerifySession(context.Background(), own, sid, mustJSON(t, row))
			if err != nil {
				t.Fatal(err)
			}
			wantResolved(t, res)
			if res.PatchSource != PatchSourceGolden || *res.ModelPatch != tk.patch {
				t.Errorf("graded %q from %q, want the row's patch", *res.ModelPatch, res.PatchSource)
			}
			if live, _ := prov.ListSandboxes(context.Background()); len(live) != 0 {
				t.Errorf("sandboxes left running: %v", live)
			}
		})
	}
	// A row without its patch cannot be graded by the golden instance.
	row := tk.row("example__calc-2")
	row["patch"] = ""
	if _, err := srv.SeedSession(context.Background(), own, "golden-nopatch", mustJSON(t, row)); !errors.Is(err, ErrInvalidRow) {
		t.Errorf("seed of a row without patch: %v, want ErrInvalidRow", err)
	}
}
