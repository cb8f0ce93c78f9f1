// Package localtest holds what the tests of the local provider and of the
// servers that run on it share.
package localtest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxowner/owner/internal/flock"
)

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

// RequireRoot fails t unless its temporary directories are under a root
// TempRoot made and this process still holds: the test binary's TestMain
// called TempRoot, so what a killed run leaves mounted there is cleared by
// the next run.
func RequireRoot(t testing.TB) {
	t.Helper()
	for d := t.TempDir(); d != filepath.Dir(d); d = filepath.Dir(d) {
		if !strings.HasPrefix(filepath.Base(d), Prefix) {
			continue
		}
		f, err := os.Open(filepath.Join(d, OwnerLock))
		if err != nil {
			t.Fatalf("%s holds no lock: %v", d, err)
		}
		defer f.Close()
		if err := flock.TryExclusive(f); !errors.Is(err, flock.ErrHeld) {
			t.Fatalf("the lock of %s is not held (%v): nothing keeps the next run from clearing it", d, err)
		}
		return
	}
	t.Fatalf("%s is under no %s* root: TestMain did not call TempRoot", t.TempDir(), Prefix)
}
