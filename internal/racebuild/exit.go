package racebuild

import (
	"slices"
	"strings"
)

// NoExitSleep returns env with GORACE=atexit_sleep_ms=0 added, unless env
// sets GORACE already: for a process a test starts of a binary that may be
// built with -race (the test binary itself, most often). A -race binary
// sleeps a second as it exits, for other goroutines' race reports: a second
// of every such child's wall time, and of the test's. Without -race GORACE
// is ignored.
func NoExitSleep(env []string) []string {
	if slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "GORACE=") }) {
		return env
	}
	return append(slices.Clip(env), "GORACE=atexit_sleep_ms=0")
}
