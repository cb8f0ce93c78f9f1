package racebuild_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/internal/racebuild"
)

func TestNoExitSleep(t *testing.T) {
	env := append(make([]string, 0, 4), "A=1")
	if diff := cmp.Diff([]string{"A=1", "GORACE=atexit_sleep_ms=0"}, racebuild.NoExitSleep(env)); diff != "" {
		t.Errorf("added (-want +got):\n%s", diff)
	}
	// The caller's slice, and what its capacity holds, are left alone.
	if diff := cmp.Diff([]string{"A=1", ""}, env[:2]); diff != "" {
		t.Errorf("the caller's slice changed (-want +got):\n%s", diff)
	}
	set := []string{"GORACE=halt_on_error=1", "B=2"}
	if diff := cmp.Diff(set, racebuild.NoExitSleep(set)); diff != "" {
		t.Errorf("a GORACE of the caller's (-want +got):\n%s", diff)
	}
}
