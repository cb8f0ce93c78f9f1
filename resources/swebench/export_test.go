package swebench

import "testing"

// Exports for the external tests (package swebench_test).

// SharedTemplateDir is the template_dir the test binary's servers share.
func SharedTemplateDir() string { return testTemplatesDir() }

// SharedStdCacheDir is the std_cache_dir the test binary's servers share.
func SharedStdCacheDir() string { return testStdCacheDir() }

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

// awaitBackground waits for the preparations refused seeds started.
func (s *Server) awaitBackground() { s.bg.Wait() }
