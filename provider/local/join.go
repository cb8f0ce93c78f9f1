package local

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/provider/local/sinit"
)

// startJoined starts cmd held at its first instruction (ptrace's stop at
// execve, before any code of the new program runs), moves it into the
// sandbox's cgroups through cgFiles (each a cgroup's membership file),
// sets its rlimits, and only then lets it run. Everything the command
// becomes, a sandbox's init and whatever it forks included, is born inside the
// sandbox's limits, and nothing the request controls (its environment, a
// preloaded library) runs before they hold. On an error cmd has been killed
// and reaped.
//
// With as, the thread that starts cmd holds as's ids as its effective
// ones, and no supplementary group, while it does (see sysProcAttr): only
// that thread, and only for the clone; it is root again before anything
// else runs on it.
func startJoined(cmd *exec.Cmd, cgFiles []*os.File, as *owner) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Ptrace = true
	// ptrace requests must come from the thread that started the child.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := startAs(cmd, as); err != nil {
		return err
	}
	pid := cmd.Process.Pid
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(pid, &ws, syscall.WALL, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return fmt.Errorf("wait for the command's first stop: %w", err)
		}
		break
	}
	if !ws.Stopped() {
		_ = cmd.Wait()
		return fmt.Errorf("the command ended before it ran (status %v)", ws)
	}
	err := join(pid, cgFiles, as == nil)
	if err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if derr := syscall.PtraceDetach(pid); derr != nil && err == nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		err = fmt.Errorf("let the command run: %w", derr)
	}
	if err != nil {
		_ = cmd.Wait()
		return err
	}
	return nil
}

// startAs starts cmd from the calling (locked) thread with as's ids as
// its effective ones. The thread's credentials are its own (raw system
// calls, not the process-wide ones Go's syscall.Setuid makes), and are
// given back before it returns; a thread that could not take them back
// is never unlocked, so it ends with its goroutine.
func startAs(cmd *exec.Cmd, as *owner) error {
	if as == nil {
		return cmd.Start()
	}
	startAsMu.Lock()
	defer startAsMu.Unlock()
	groups, err := unix.Getgroups()
	if err != nil {
		return err
	}
	restore := func() error {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), 0, ^uintptr(0)); e != 0 {
			return e
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), 0, ^uintptr(0)); e != 0 {
			return e
		}
		return setThreadGroups(groups)
	}
	take := func() error {
		if err := setThreadGroups(nil); err != nil {
			return err
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), uintptr(as.gid), ^uintptr(0)); e != 0 {
			return e
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(as.uid), ^uintptr(0)); e != 0 {
			return e
		}
		return nil
	}
	// A change of effective uid makes the process undumpable, and so its
	// clone's /proc files root's: the thread could not write the new
	// namespace's maps. It is set back to what it was.
	dumpable, derr := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	if derr != nil {
		return derr
	}
	err = take()
	if err == nil {
		if err = unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0); err == nil {
			err = cmd.Start()
		}
	}
	rerr := restore()
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, uintptr(dumpable), 0, 0, 0)
	if rerr != nil {
		runtime.LockOSThread() // never unlocked: the thread ends with its goroutine
		if err == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		return fmt.Errorf("take back the server thread's ids: %w", rerr)
	}
	if err != nil {
		return fmt.Errorf("start as uid %d: %w", as.uid, err)
	}
	return nil
}

// startAsMu makes starts as another uid (startAs) one at a time in the
// process. Dumpability is the process's, not the thread's: a thread's
// change of effective uid makes the whole process undumpable, so another
// start meanwhile cloned an undumpable child whose /proc files (uid_map,
// gid_map, setgroups) its thread, no longer root, could not write (its
// start failed with "permission denied" or "operation not permitted").
// Kernel state of the whole process needs a lock of the whole process.
var startAsMu sync.Mutex

// setThreadGroups sets the calling thread's supplementary groups.
func setThreadGroups(groups []int) error {
	gs := make([]uint32, len(groups)+1) // never empty, for the pointer
	for i, g := range groups {
		gs[i] = uint32(g)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(unsafe.Pointer(&gs[0])), 0); e != 0 {
		return e
	}
	return nil
}

// join puts the stopped process pid (one thread) into the cgroups and,
// with rlimits, sets its rlimits (see sinit.SetRlimits). A process started as a
// sandbox's own uid sets them itself, first thing: the server may lack
// the capability to set another uid's.
func join(pid int, cgFiles []*os.File, rlimits bool) error {
	id := []byte(strconv.Itoa(pid))
	for _, f := range cgFiles {
		if _, err := f.Write(id); err != nil {
			return fmt.Errorf("enter the sandbox's cgroup %s: %w", f.Name(), err)
		}
	}
	if !rlimits {
		return nil
	}
	return sinit.SetRlimits(pid)
}
