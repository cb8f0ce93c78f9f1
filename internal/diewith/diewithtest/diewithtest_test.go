package diewithtest

import (
	"os/exec"
	"testing"
)

// TestAProcessThatTookAFreedPidIsNotTheOneWaitedFor: a process at a
// waited-for pid that started after the wait began is another's (the pid
// was freed and reused): it counts as gone at once and is not killed.
// One that started before it is the one waited for.
func TestAProcessThatTookAFreedPidIsNotTheOneWaitedFor(t *testing.T) {
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	started, ok := running(cmd.Process.Pid)
	if !ok {
		t.Fatalf("the sleep (%d) is not running", cmd.Process.Pid)
	}
	now, err := uptimeTicks()
	if err != nil {
		t.Fatal(err)
	}
	if started > now {
		t.Fatalf("started at tick %d, after now (%d)", started, now)
	}
	goneSince(t, map[int]string{cmd.Process.Pid: "a newcomer at the pid"}, started-1)
	if !Running(cmd.Process.Pid) {
		t.Fatal("the newcomer was killed")
	}
}
