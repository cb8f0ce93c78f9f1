// Package localtest holds what the tests of the local provider and of the
// servers that run on it share.
package localtest

import (
	"os"
	"strings"
	"testing"
)

// MountsUnder lists the mount points at or under dir in this process's
// mount table: what a provider, or a server stopped mid-work, left mounted.
func MountsUnder(t testing.TB, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}
