package local

import (
	"context"
	"errors"
	"os/exec"
	"testing"
	"time"
)

// TestWaitPidsStoppedEndsWithItsContext: a wait for a process that never
// stops returns its context's error once the context ends, not after its
// limit.
func TestWaitPidsStoppedEndsWithItsContext(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep to run: %v", err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := waitPidsStopped(ctx, []int{cmd.Process.Pid}, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("waitPidsStopped with an ended context: %v, want context.Canceled", err)
	}
}
