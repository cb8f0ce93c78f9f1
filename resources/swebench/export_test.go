package swebench

import "testing"

// Exports for the external tests (package swebench_test).

// SharedCacheDir is where the test binary's shared caches are.
func SharedCacheDir() string { return testCachesDir() }

// SharedCaches is sharedCaches.
func SharedCaches(dir string) map[string]string { return sharedCaches(dir) }

// TaskRepo is the test task: its repository and rows.
type TaskRepo struct {
	Dir, Base, Patch       string
	Row, MultilingualRow   map[string]any
	Repo, TestCommand      string
	FailToPass, PassToPass []string
}

// NewTaskRepo makes the task repository (newTask).
func NewTaskRepo(t *testing.T) TaskRepo {
	tk := newTask(t)
	return TaskRepo{
		Dir: tk.dir, Base: tk.base, Patch: tk.patch,
		Row: tk.row("example__calc-1"), MultilingualRow: tk.multilingualRow("example__calc-1"),
		Repo: taskRepo, TestCommand: goTestCmd, FailToPass: failToPass, PassToPass: passToPass,
	}
}
