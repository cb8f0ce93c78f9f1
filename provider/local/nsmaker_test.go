package local

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// nsStorage is the storage owner the namespaces here map from.
var nsStorage = owner{DefaultUID, DefaultGID}

// ownerSeenThrough mounts a view, through the user namespace nsfd, of a
// directory holding a file the storage uid owns, and returns the uid and
// gid the file shows as there.
func ownerSeenThrough(t *testing.T, nsfd int) owner {
	t.Helper()
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "view")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(src, "f"), nsStorage.uid, nsStorage.gid); err != nil {
		t.Fatal(err)
	}
	if err := idmapMount(src, dst, nsfd, true); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := unmount(dst); err != nil {
			t.Error(err)
		}
	}()
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dst, "f"), &st); err != nil {
		t.Fatal(err)
	}
	return owner{int(st.Uid), int(st.Gid)}
}

// makeNS asks the process's helper for a namespace mapping the storage
// ids to ids and checks a view through it shows them.
func makeNS(t *testing.T, ids owner) {
	t.Helper()
	fd, err := userNS.make(nsStorage, ids)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if got := ownerSeenThrough(t, fd); got != ids {
		t.Errorf("a storage file seen through the namespace for %+v is owned by %+v", ids, got)
	}
}

// A view's user namespace comes from the helper: making one forks nothing
// of the server, so it is made while the server's fork lock is held
// (every fork and exec of the server takes it; a clone into a new user
// namespace copies the whole server's memory map under it).
func TestAViewsNamespaceIsMadeWithoutForkingTheServer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP: idmapped mounts need root")
	}
	makeNS(t, owner{1_600_001, 1_600_001}) // the helper runs
	syscall.ForkLock.Lock()
	locked := true
	defer func() {
		if locked {
			syscall.ForkLock.Unlock()
		}
	}()
	type made struct {
		fd  int
		err error
	}
	done := make(chan made, 1)
	go func() {
		fd, err := userNS.make(nsStorage, owner{1_600_002, 1_600_003})
		done <- made{fd, err}
	}()
	var got made
	select {
	case got = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("no namespace while the server's fork lock is held: the server forks to make one")
	}
	syscall.ForkLock.Unlock()
	locked = false
	if got.err != nil {
		t.Fatal(got.err)
	}
	defer unix.Close(got.fd)
	if seen := ownerSeenThrough(t, got.fd); seen != (owner{1_600_002, 1_600_003}) {
		t.Errorf("a storage file seen through the namespace is owned by %+v, want 1600002:1600003", seen)
	}
}

// A helper that died is started again by the next namespace asked for,
// which it makes.
func TestAHelperThatDiedIsStartedAgain(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP: idmapped mounts need root")
	}
	makeNS(t, owner{1_600_011, 1_600_011})
	userNS.mu.RLock()
	gen, helper := userNS.gen, userNS.cmd.Process
	userNS.mu.RUnlock()
	if err := helper.Kill(); err != nil {
		t.Fatal(err)
	}
	makeNS(t, owner{1_600_012, 1_600_012})
	userNS.mu.RLock()
	after := userNS.gen
	userNS.mu.RUnlock()
	if after != gen+1 {
		t.Errorf("helpers started: %d before the kill, %d after; want one more", gen, after)
	}
}
