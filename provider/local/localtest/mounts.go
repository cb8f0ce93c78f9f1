// Package localtest holds what the tests of the local provider and of the
// servers that run on it share.
package localtest

import "testing"

// MountsUnder lists the mount points at or under dir in this process's
// mount table: what a provider, or a server stopped mid-work, left mounted.
func MountsUnder(t testing.TB, dir string) []string {
	t.Helper()
	out, err := mountsUnder(dir)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
