package flock

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/sandboxowner/owner/internal/flock/flocktest"
)

func lockAt(t *testing.T, path string) (*os.File, error) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := TryExclusive(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

func TestASecondOpenIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	f, err := lockAt(t, path)
	if err != nil {
		t.Fatal(err)
	}
	defer Release(f)
	_, err = lockAt(t, path)
	if !errors.Is(err, ErrHeld) || !errors.Is(err, syscall.EWOULDBLOCK) {
		t.Fatalf("second lock: %v, want ErrHeld wrapping EWOULDBLOCK", err)
	}
}

// A child that holds a copy of the locked file (one forked and not yet
// exec'd) does not keep the lock past Release.
func TestReleaseEndsTheLockAChildHoldsACopyOf(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	f, err := lockAt(t, path)
	if err != nil {
		t.Fatal(err)
	}
	flocktest.HoldCopies(t)
	if err := Release(f); err != nil {
		t.Fatal(err)
	}
	g, err := lockAt(t, path)
	if err != nil {
		t.Fatalf("lock after Release, a child holding a copy: %v", err)
	}
	if err := Release(g); err != nil {
		t.Fatal(err)
	}
}

// Closing alone is what Release must not be: the child's copy keeps the
// lock. This is the test's check that HoldCopies stands in for such a
// child at all.
func TestAChildsCopyKeepsALockTheFileWasClosedOn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	f, err := lockAt(t, path)
	if err != nil {
		t.Fatal(err)
	}
	flocktest.HoldCopies(t)
	_ = f.Close()
	if g, err := lockAt(t, path); !errors.Is(err, ErrHeld) {
		if g != nil {
			_ = Release(g)
		}
		t.Fatalf("lock after a plain close, a child holding a copy: %v, want ErrHeld", err)
	}
}

func TestReleaseOfAClosedFileFails(t *testing.T) {
	f, err := lockAt(t, filepath.Join(t.TempDir(), "lock"))
	if err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	if err := Release(f); err == nil {
		t.Fatal("Release of a closed file: nil error")
	}
}
