package localtest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/internal/flock"
)

// Prefix names the directory under the system's temporary directory that
// a test binary calling TempRoot keeps its temporary files in (its tests'
// t.TempDir, and so their providers' roots).
const Prefix = "sandboxowner-localtest-"

// OwnerLock is the file in such a directory that its test binary holds
// locked for as long as it lives.
const OwnerLock = "owner.lock"

// TempRoot is for a test binary's TestMain, before its tests run. A test
// binary killed by go test's -timeout runs no cleanup: its sandboxes'
// overlays and disks stay mounted under its t.TempDir directories, and
// nothing later removes them. TempRoot first clears what such dead test
// binaries left (Reap under os.TempDir()), then makes this process's own
// directory there, locked until the process ends, and points TMPDIR at
// it, so that every t.TempDir of the run, and every child the tests start,
// lands inside it. done, after the tests ran, removes the directory when
// nothing is mounted under it; otherwise the next run's Reap clears it.
func TempRoot() (done func(), err error) {
	base := os.TempDir()
	if _, err := Reap(base); err != nil {
		// One left directory that cannot be cleared must not stop the
		// tests: say it and go on.
		fmt.Fprintf(os.Stderr, "localtest: what dead test binaries left under %s: %v\n", base, err)
	}
	dir, err := os.MkdirTemp(base, Prefix)
	if err != nil {
		return nil, fmt.Errorf("localtest: temp root: %w", err)
	}
	// The lock file gets its name only once it is locked: a Reap running
	// meanwhile never finds an unlocked owner.lock in a live directory.
	f, err := os.OpenFile(filepath.Join(dir, OwnerLock+".new"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("localtest: temp root: %w", err)
	}
	if err := flock.TryExclusive(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("localtest: temp root: %w", err)
	}
	if _, err := fmt.Fprintf(f, "%d\n", os.Getpid()); err != nil {
		_ = flock.Release(f)
		return nil, fmt.Errorf("localtest: temp root: %w", err)
	}
	if err := os.Rename(f.Name(), filepath.Join(dir, OwnerLock)); err != nil {
		_ = flock.Release(f)
		return nil, fmt.Errorf("localtest: temp root: %w", err)
	}
	if err := os.Setenv("TMPDIR", dir); err != nil {
		_ = flock.Release(f)
		return nil, fmt.Errorf("localtest: temp root: %w", err)
	}
	return func() {
		_ = os.Setenv("TMPDIR", base)
		if mounts, err := mountsUnder(dir); err == nil && len(mounts) == 0 {
			_ = os.RemoveAll(dir)
		}
		_ = flock.Release(f)
	}, nil
}

// Reap clears what dead test binaries left under base: each directory
// named Prefix* whose OwnerLock no process holds (its test binary is gone:
// the kernel drops a flock with the last holder of the file) has the mounts
// under it detached, deepest first, and is then removed. A directory whose
// owner lives, or that has no OwnerLock (not made by TempRoot), is left
// alone, as is everything not named Prefix*. It returns the directories it
// removed.
func Reap(base string) ([]string, error) {
	dirs, err := filepath.Glob(filepath.Join(base, Prefix+"*"))
	if err != nil {
		return nil, fmt.Errorf("localtest: reap %s: %w", base, err)
	}
	var reaped []string
	var errs []error
	for _, dir := range dirs {
		ok, err := reapOne(dir)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			reaped = append(reaped, dir)
		}
	}
	return reaped, errors.Join(errs...)
}

// reapOne clears dir if its owner is gone; it reports whether it removed it.
func reapOne(dir string) (bool, error) {
	f, err := os.OpenFile(filepath.Join(dir, OwnerLock), os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return false, fmt.Errorf("localtest: reap %s: %w", dir, err)
	}
	// Held through the clearing, so that two reapers never clear one
	// directory at once.
	if err := flock.TryExclusive(f); err != nil {
		_ = f.Close()
		if errors.Is(err, flock.ErrHeld) {
			return false, nil
		}
		return false, fmt.Errorf("localtest: reap %s: %w", dir, err)
	}
	defer flock.Release(f)
	mounts, err := mountsUnder(dir)
	if err != nil {
		return false, fmt.Errorf("localtest: reap %s: %w", dir, err)
	}
	// Deepest first: a mount inside another goes before it. A lazy detach
	// succeeds even while a process the dead binary left still uses it.
	slices.SortFunc(mounts, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	for _, m := range mounts {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return false, fmt.Errorf("localtest: reap %s: unmount %s: %w", dir, m, err)
		}
	}
	// Removing through a mount would delete what it binds (a host
	// directory, a shared cache): only a directory with none left goes.
	if left, err := mountsUnder(dir); err != nil || len(left) > 0 {
		return false, fmt.Errorf("localtest: reap %s: still mounted %v (%v)", dir, left, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return false, fmt.Errorf("localtest: reap %s: %w", dir, err)
	}
	return true, nil
}

// mountsUnder is MountsUnder for code that runs outside a test.
func mountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	return mountsIn(string(b), dir), nil
}

// mountsIn lists the mount points at or under dir in a mountinfo text.
func mountsIn(mountinfo, dir string) []string {
	var out []string
	for _, line := range strings.Split(mountinfo, "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}
