package local

import (
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// Starting a command as another uid changes the starting thread's ids,
// which makes the whole process undumpable: a start on another thread
// meanwhile cloned an undumpable child, whose /proc files (uid_map,
// gid_map, setgroups) the starting thread, no longer root, could not
// write, and the start failed ("permission denied", "operation not
// permitted"). Here another thread changes its ids over and over, as
// starts do, under the same lock: every start succeeds.
func TestAStartAsAnotherUidIsNotUndoneByAnothersIds(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("SKIP: starting a command as another uid needs root")
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		runtime.LockOSThread() // its ids change: never unlocked, the thread ends with the goroutine
		for {
			select {
			case <-stop:
				return
			default:
			}
			startAsMu.Lock()
			_, _, e1 := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), 4299, ^uintptr(0))
			_, _, e2 := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), 0, ^uintptr(0))
			_ = unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0)
			startAsMu.Unlock()
			if e1 != 0 || e2 != 0 {
				t.Errorf("change the thread's uid: %v, %v", e1, e2)
				return
			}
		}
	}()
	defer func() { close(stop); <-stopped }()
	as := &owner{uid: 4200, gid: 4200}
	failed := 0
	for range 50 {
		cmd := &exec.Cmd{Path: "/bin/true", Args: []string{"true"}, Dir: "/"}
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: as.uid, Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: as.gid, Size: 1}},
			Credential:  &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true},
		}
		// As startJoined does: the thread's ids are startAs's.
		runtime.LockOSThread()
		err := startAs(cmd, as)
		runtime.UnlockOSThread()
		if err != nil {
			if failed++; failed <= 3 {
				t.Error(err)
			}
			continue
		}
		_ = cmd.Wait()
	}
	if failed > 0 {
		t.Errorf("%d of 50 starts failed", failed)
	}
}
