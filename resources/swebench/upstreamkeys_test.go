package swebench

import (
	"errors"
	"testing"
)

// Upstream's configuration keys are accepted: sandbox_provider names the
// one sandbox block, sandbox_checkpoint is checked as upstream's
// checkpointer checks it, and clear_swebench_debug_logs defaults to true
// except in the golden-patch instance.
func TestUpstreamKeys(t *testing.T) {
	for _, bad := range []Config{
		{SandboxProvider: "docker"},
		{SandboxCheckpoint: SandboxCheckpoint{OnStop: "pause"}},
		{SandboxCheckpoint: SandboxCheckpoint{Parallelism: -1}},
	} {
		if _, err := New(bad, Deps{}); !errors.Is(err, ErrConfig) {
			t.Errorf("New(%+v): %v, want ErrConfig", bad, err)
		}
	}
	if _, err := New(Config{SandboxProvider: "sandbox", SandboxCheckpoint: SandboxCheckpoint{Parallelism: 4, OnStop: "none"}}, Deps{}); err != nil {
		t.Errorf("upstream's keys refused: %v", err)
	}
	cases := []struct {
		cfg  Config
		keep bool
	}{
		{Config{}, false},
		{Config{ClearSwebenchDebugLogs: off()}, true},
		{Config{IsVerifyingGoldenPatch: true}, true},
	}
	for _, c := range cases {
		if got := c.cfg.keepLogs(); got != c.keep {
			t.Errorf("%+v keeps logs: %v, want %v", c.cfg, got, c.keep)
		}
	}
	if (Config{}).applyAntiCheating() != true || (Config{ApplyAntiCheating: off()}).applyAntiCheating() {
		t.Error("apply_anti_cheating: want true by default, false when off")
	}
}
