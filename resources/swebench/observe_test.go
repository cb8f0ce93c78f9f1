package swebench

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// recorder is an Observer that keeps what it is told.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) Environment(outcome string, _ time.Duration) { r.add("environment " + outcome) }
func (r *recorder) Validation(outcome string, _ time.Duration)  { r.add("validation " + outcome) }
func (r *recorder) add(e string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}
func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

// TestObserverIsToldOfEnvironmentsAndValidations: the first seed of a
// template builds its environment and validates its instance, and the
// observer is told of both with their outcome; a second instance of the
// same template is validated (here refused: a PASS_TO_PASS test fails)
// without a second environment; a seed of an instance already validated
// tells nothing. The task's tests are a printf, so nothing is compiled.
func TestObserverIsToldOfEnvironmentsAndValidations(t *testing.T) {
	needTools(t, "git", "go", "patch")
	dir := filepath.Join(t.TempDir(), "shell")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	git(t, dir, "init", "-q", "-b", "main")
	writeFiles(t, dir, map[string]string{"a.txt": "one\n"})
	git(t, dir, "add", "-A")
	git(t, dir, "commit", "-q", "-m", "base")
	base := git(t, dir, "rev-parse", "HEAD")
	writeFiles(t, dir, map[string]string{"a.txt": "two\n", "t.txt": "test\n"})
	git(t, dir, "add", "-A")
	git(t, dir, "commit", "-q", "-m", "fix")
	fix := git(t, dir, "rev-parse", "HEAD")
	patch := git(t, dir, "diff", base, fix, "--", "a.txt") + "\n"
	testPatch := git(t, dir, "diff", base, fix, "--", "t.txt") + "\n"
	row := func(id string, p2p []string) map[string]any {
		return map[string]any{"repo": "example/shell", "instance_id": id, "base_commit": base, "patch": patch, "test_patch": testPatch,
			"FAIL_TO_PASS": []string{"TestB"}, "PASS_TO_PASS": p2p}
	}
	rec := &recorder{}
	w := newWorld(t, task{}, unisolated(), freshTemplates(), withConfig(func(c *Config) {
		c.Repos = map[string]string{"example/shell": dir}
		c.TestCommands = map[string]string{"example/shell": `printf '%s\n' '--- PASS: TestA (0.00s)' '--- FAIL: TestB (0.00s)'`}
	}))
	w.srv.observer = rec

	w.seed("s1", row("example__shell-1", []string{"TestA"}))
	if diff := cmp.Diff([]string{"environment ok", "validation available"}, rec.got()); diff != "" {
		t.Errorf("first seed (-want +got):\n%s", diff)
	}
	raw, _ := json.Marshal(row("example__shell-2", []string{"TestA", "TestB"}))
	if _, err := w.srv.SeedSession(context.Background(), w.own, "s2", raw); err == nil {
		t.Error("an instance whose PASS_TO_PASS test fails was seeded")
	}
	w.seed("s3", row("example__shell-1", []string{"TestA"}))
	if diff := cmp.Diff([]string{"environment ok", "validation available", "validation unavailable"}, rec.got()); diff != "" {
		t.Errorf("after the second instance and a second seed of the first (-want +got):\n%s", diff)
	}
}
