package swebench

import (
	"os"
	"testing"
)

// TestSharedCachesMakeGradingWarm grades the gold patch twice on fresh
// caches and reports both times: the first grading fills Go's module and
// build caches, the second reuses them. (It runs first in the package, on
// the shared caches while they are still empty, so the other tests start
// warm.)
func TestSharedCachesMakeGradingWarm(t *testing.T) {
	tk := newTask(t)
	dir := testCachesDir()
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		dir = t.TempDir()
	}
	w := newWorld(t, tk, withCaches(dir))
	var times [2]VerifyResult
	for i := range times {
		sid := []string{"s-cold", "s-warm"}[i]
		seed := w.seed(sid, tk.row("example__calc-1"))
		w.applyAsAgent(*seed.SandboxHandle, tk.patch)
		times[i] = w.verify(sid, tk.row("example__calc-1"))
		wantResolved(t, times[i])
	}
	cold, warm := times[0], times[1]
	t.Logf("grading on cold caches: eval %.1fs, whole grading %.1fs; warm: eval %.1fs, whole grading %.1fs (isolation %s, overlay %v)",
		cold.EvalTimeTaken, cold.PatchVerificationTimeTaken, warm.EvalTimeTaken, warm.PatchVerificationTimeTaken, w.prov.Isolation(), w.prov.Overlay())
	if warm.EvalTimeTaken >= cold.EvalTimeTaken {
		t.Errorf("the warm grading (%.1fs) was no faster than the cold one (%.1fs): are the caches shared?", warm.EvalTimeTaken, cold.EvalTimeTaken)
	}
	// The task module has no dependencies, so only the build cache fills.
	if entries, err := os.ReadDir(sharedCaches(dir)["gobuild"]); err != nil || len(entries) == 0 {
		t.Errorf("the build cache is empty after a grading: %v", err)
	}
}
