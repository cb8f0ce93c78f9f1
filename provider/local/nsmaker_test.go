package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
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

// makeNS asks the helper m for a namespace mapping the storage
// ids to ids and checks a view through it shows them.
func makeNS(t *testing.T, m *nsMaker, ids owner) {
	t.Helper()
	fd, err := m.make(context.Background(), nsStorage, ids)
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
	// Not parallel: it holds the process's fork lock, which every other
	// test's fork waits for.
	if os.Geteuid() != 0 {
		t.Skip("SKIP: idmapped mounts need root")
	}
	userNS := testNSMaker(t)
	makeNS(t, userNS, owner{1_600_001, 1_600_001}) // the helper runs
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
		fd, err := userNS.make(context.Background(), nsStorage, owner{1_600_002, 1_600_003})
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
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("SKIP: idmapped mounts need root")
	}
	userNS := testNSMaker(t)
	makeNS(t, userNS, owner{1_600_011, 1_600_011})
	userNS.mu.RLock()
	gen, helper := userNS.gen, userNS.cmd.Process
	userNS.mu.RUnlock()
	if err := helper.Kill(); err != nil {
		t.Fatal(err)
	}
	makeNS(t, userNS, owner{1_600_012, 1_600_012})
	userNS.mu.RLock()
	after := userNS.gen
	userNS.mu.RUnlock()
	if after != gen+1 {
		t.Errorf("helpers started: %d before the kill, %d after; want one more", gen, after)
	}
}

// testNSMaker is a helper of the test's own, ended at its end.
func testNSMaker(t *testing.T) *nsMaker {
	m := newNSMaker()
	t.Cleanup(m.close)
	return m
}

// A closed provider's helper ends, and no namespace is made for it after:
// a helper started again by a fill still running would outlive it.
func TestAClosedHelperMakesNoNamespace(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("SKIP: idmapped mounts need root")
	}
	m := testNSMaker(t)
	makeNS(t, m, owner{1_600_021, 1_600_021})
	m.mu.RLock()
	helper := m.cmd
	m.mu.RUnlock()
	m.close()
	if _, err := m.make(context.Background(), nsStorage, owner{1_600_022, 1_600_022}); !errors.Is(err, errNSMakerClosed) {
		t.Errorf("a namespace asked of a closed helper: %v, want errNSMakerClosed", err)
	}
	// The helper ends once its control socket is closed (ESRCH: it ended
	// and was reaped already).
	if pfd, err := unix.PidfdOpen(helper.Process.Pid, 0); err == nil {
		defer unix.Close(pfd)
		fds := []unix.PollFd{{Fd: int32(pfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int((2 * time.Minute).Milliseconds()))
		for err == unix.EINTR {
			n, err = unix.Poll(fds, int((2 * time.Minute).Milliseconds()))
		}
		if err != nil || n != 1 {
			t.Errorf("the helper still runs after its provider closed (poll %d, %v)", n, err)
		}
	} else if !errors.Is(err, unix.ESRCH) {
		t.Fatal(err)
	}
	m.mu.RLock()
	gen, fd := m.gen, m.fd
	m.mu.RUnlock()
	if gen != 1 || fd != -1 {
		t.Errorf("after close: %d helpers started, control socket %d; want 1 and -1", gen, fd)
	}
}

// fakeHelper is a helper that runs no process: the test holds its end of
// the control socket (returned), and reads and answers as it likes.
func fakeHelper(t *testing.T) (*nsMaker, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		t.Fatal(err)
	}
	m := newNSMaker()
	m.fd, m.gen = fds[0], 1
	t.Cleanup(func() { unix.Close(fds[1]) })
	t.Cleanup(m.close)
	return m, fds[1]
}

// awaitMade waits for the namespace asked for on done, at most a bound
// that only a hang reaches.
func awaitMade(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(2 * time.Minute):
		t.Fatal("a namespace asked for is still awaited")
		return nil
	}
}

// askAsync asks m for a namespace within ctx and sends the error on the
// channel returned.
func askAsync(ctx context.Context, m *nsMaker) <-chan error {
	done := make(chan error, 1)
	go func() {
		fd, err := m.make(ctx, nsStorage, owner{1_600_031, 1_600_031})
		if err == nil {
			unix.Close(fd)
		}
		done <- err
	}()
	return done
}

// A namespace's wait for the helper's answer ends with its caller's
// context: a helper that took the request and never answers holds no
// start.
func TestANamespaceNeverAnsweredEndsWithItsContext(t *testing.T) {
	t.Parallel()
	m, helper := fakeHelper(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := askAsync(ctx, m)
	buf, oob := make([]byte, 4<<10), make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(helper, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	reply := rightsFd(oob[:oobn])
	if reply < 0 {
		t.Fatal("a request without its answer socket")
	}
	defer unix.Close(reply) // held: the answer never comes, nor the end
	cancel()
	if err := awaitMade(t, done); !errors.Is(err, context.Canceled) {
		t.Errorf("a namespace never answered, its context cancelled: %v, want context.Canceled", err)
	}
}

// A helper that reads no request fills its control socket; a namespace
// asked for then waits for room until its caller's context ends, or the
// provider closes.
func TestANamespaceWaitingForTheHelperEnds(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		end  func(m *nsMaker, cancel context.CancelFunc)
		want error
	}{
		{"its context cancelled", func(_ *nsMaker, cancel context.CancelFunc) { cancel() }, context.Canceled},
		{"the provider closed", func(m *nsMaker, _ context.CancelFunc) { m.close() }, errNSMakerClosed},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, _ := fakeHelper(t)
			for {
				err := unix.Sendmsg(m.fd, []byte("{}"), nil, nil, unix.MSG_DONTWAIT)
				if err == unix.EAGAIN {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			blocked := make(chan struct{})
			m.full = sync.OnceFunc(func() { close(blocked) })
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := askAsync(ctx, m)
			select {
			case <-blocked:
			case err := <-done:
				t.Fatalf("a namespace asked of a helper whose socket is full: %v, without waiting", err)
			}
			c.end(m, cancel)
			if err := awaitMade(t, done); !errors.Is(err, c.want) {
				t.Errorf("a namespace waiting for room, %s: %v, want %v", c.name, err, c.want)
			}
		})
	}
}
