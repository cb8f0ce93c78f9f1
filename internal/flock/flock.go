// Package flock takes and drops the exclusive flocks the server keeps on its
// directories (the snapshot index's, the local provider's root), so that a
// lock ends when its holder lets go of it and not later.
//
// A flock belongs to the open file, not to the descriptor: every process
// forked while the file is open holds a copy of it until that process
// execs (Go opens files close-on-exec, not close-on-fork). Closing the file
// alone therefore leaves the lock held while such a child is still on its
// way to exec, and a process that starts children all the time (a local
// sandbox's user-namespace child is a full fork of the server, hundreds of
// milliseconds on a loaded machine) found a directory it had just closed
// still locked when it opened it again. Release unlocks first, which ends
// the lock for every copy of the file at once.
package flock

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// ErrHeld: another open file holds the lock (another process, or another
// open of the same path in this one). It wraps syscall.EWOULDBLOCK.
var ErrHeld = fmt.Errorf("held elsewhere: %w", syscall.EWOULDBLOCK)

// TryExclusive takes an exclusive flock of f without waiting: ErrHeld when
// another open file holds one.
func TryExclusive(f *os.File) error {
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return ErrHeld
		}
		return fmt.Errorf("flock %s: %w", f.Name(), err)
	}
	return nil
}

// Release drops f's lock, for every copy of the file a child holds too,
// and closes f.
func Release(f *os.File) error {
	uerr := syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	if uerr != nil {
		uerr = fmt.Errorf("unlock %s: %w", f.Name(), uerr)
	}
	return errors.Join(uerr, f.Close())
}
