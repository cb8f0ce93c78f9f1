package local

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// The rlimits every command runs under, cgroups or not.
const (
	rlimitNofile = 4096
	// rlimitFsize bounds one file's size (256 MiB).
	rlimitFsize = 256 << 20
)

// startJoined starts cmd held at its first instruction (ptrace's stop at
// execve, before any code of the new program runs), moves it into the
// sandbox's cgroups through cgFiles (each a cgroup's membership file),
// sets its rlimits, and only then lets it run. Everything the command
// becomes, a sandbox's init and whatever it forks included, is born inside the
// sandbox's limits, and nothing the request controls (its environment, a
// preloaded library) runs before they hold. On an error cmd has been killed
// and reaped.
func startJoined(cmd *exec.Cmd, cgFiles []*os.File) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Ptrace = true
	// ptrace requests must come from the thread that started the child.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cmd.Start(); err != nil {
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
	err := join(pid, cgFiles)
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

// join puts the stopped process pid (one thread) into the cgroups and sets
// its rlimits: no core files, rlimitNofile open files, files of at most
// rlimitFsize bytes, hard and soft.
func join(pid int, cgFiles []*os.File) error {
	id := []byte(strconv.Itoa(pid))
	for _, f := range cgFiles {
		if _, err := f.Write(id); err != nil {
			return fmt.Errorf("enter the sandbox's cgroup %s: %w", f.Name(), err)
		}
	}
	for _, l := range []struct {
		res int
		max uint64
	}{{unix.RLIMIT_CORE, 0}, {unix.RLIMIT_NOFILE, rlimitNofile}, {unix.RLIMIT_FSIZE, rlimitFsize}} {
		if err := unix.Prlimit(pid, l.res, &unix.Rlimit{Cur: l.max, Max: l.max}, nil); err != nil {
			return fmt.Errorf("set rlimit %d: %w", l.res, err)
		}
	}
	return nil
}
