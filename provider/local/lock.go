package local

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/sandboxowner/owner/internal/flock"
)

// LockFile is the file under Root that an exclusive provider holds locked.
const LockFile = "server.lock"

// ErrRootLocked: Options.Exclusive was asked for and another provider holds
// the root (another server process, or another exclusive provider here).
var ErrRootLocked = errors.New("local: sandbox root is in use")

// lockRoot takes an exclusive flock on root's lock file and writes this
// process's id into it; the lock lasts until Close releases it or the
// process ends, so a crashed server never leaves a stale lock behind.
func lockRoot(root string) (*os.File, error) {
	path := filepath.Join(root, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("local: lock the root: %w", err)
	}
	if err := flock.TryExclusive(f); err != nil {
		_ = f.Close()
		if !errors.Is(err, flock.ErrHeld) {
			return nil, fmt.Errorf("local: lock the root: %w", err)
		}
		holder := "another process"
		if b, rerr := os.ReadFile(path); rerr == nil {
			if pid, perr := strconv.Atoi(string(bytes.TrimSpace(b))); perr == nil {
				holder = "process " + strconv.Itoa(pid)
			}
		}
		return nil, fmt.Errorf("%w: %s is held by %s (one server per sandbox root: stop it, or give this one another sandbox.local.root)", ErrRootLocked, root, holder)
	}
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("local: lock the root: %w", err)
	}
	return f, nil
}

// Close releases the root's lock (Options.Exclusive), for the sandboxes'
// children still on their way to exec too (see internal/flock), and gives
// back the ids made ahead (see readyIDs) and the namespaces. Sandboxes are
// not touched: a provider on the same root finds them again. The cgroup
// parents it made go when no sandbox is in them (a provider that started
// none left one behind in the server's cgroup until another's sweep).
func (p *Provider) Close() error {
	p.ready.close()
	p.readyNS.close()
	p.ns.close()
	p.cg.removeEmptyParents()
	p.mu.Lock()
	f := p.lock
	p.lock = nil
	p.mu.Unlock()
	if f == nil {
		return nil
	}
	return flock.Release(f)
}
