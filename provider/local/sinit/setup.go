package sinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The kinds of MountOp: what a sandbox's init mounts to build its root.
const (
	OpROBind  = "ro-bind"  // the host's Src at Dst, read-only, recursively
	OpBind    = "bind"     // the host's Src at Dst, writable
	OpSymlink = "symlink"  // a symlink at Dst to Src
	OpHideDir = "hide-dir" // an empty read-only directory over Dst
	OpDev     = "dev"      // a minimal /dev at Dst
	OpProc    = "proc"     // the sandbox's own /proc at Dst
	OpTmp     = "tmp"      // a private, writable /tmp at Dst
)

// MountOp is one step of a sandbox's root: Src is a host path (or a
// symlink's target), Dst a path in the sandbox.
type MountOp struct {
	Kind string `json:"kind"`
	Src  string `json:"src,omitempty"`
	Dst  string `json:"dst"`
}

// Setup is what a sandbox's init builds before it starts a command:
// its root from Ops (in order), its cwd, its network (loopback only unless
// Network), and its syscall filter (a classic BPF program; none if empty).
type Setup struct {
	Ops     []MountOp `json:"ops"`
	Cwd     string    `json:"cwd"`
	Network bool      `json:"network,omitempty"`
	Filter  []byte    `json:"filter,omitempty"`
}

// Paths in the init's mount namespace while it builds the sandbox's root:
// the host's root is moved to oldRoot, and the new one is made at newRoot.
const (
	oldRoot = "/oldroot"
	newRoot = "/newroot"
)

// devNodes are the host devices a sandbox's /dev holds.
var devNodes = []string{"null", "zero", "full", "random", "urandom", "tty"}

// RunSetup is the first stage of a sandbox's init (argv[1] StageSetup): the
// server started it as root of new user, mount, pid, ipc, uts and network
// namespaces, inside the sandbox's cgroups. It reads its Setup from
// the control socket, builds the sandbox's root and pivots into it, enters
// a cgroup namespace of its own, brings loopback up, forbids further user
// namespaces, drops every capability (the bounding set included), sets
// no_new_privs, loads the syscall filter, and executes itself again as
// the init proper (argv[1] StageRun): each of these holds one thread, and an
// execve makes them the whole process's. The init's binary (the server's,
// or a separate init's) is executed from the descriptor the server passed
// (ExeFd), so the sandbox's root never shows it.
func RunSetup() int {
	runtime.LockOSThread() // every step below holds the thread that executes
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	_ = unix.CloseRange(Fd+1, ^uint(0), closeRangeCloexec)
	// Before anything else: the server sets a sandbox's rlimits itself
	// only where it runs as the server's uid.
	if err := SetRlimits(0); err != nil {
		return 125
	}
	fail := func(err error) int {
		b, _ := json.Marshal(Msg{Op: "exit", Error: err.Error()})
		_ = unix.Sendmsg(Fd, b, nil, nil, 0)
		return 125
	}
	buf := make([]byte, MaxMsg)
	var n int
	var err error
	for {
		n, _, _, _, err = unix.Recvmsg(Fd, buf, nil, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil || n == 0 {
		return 125
	}
	var m Msg
	if err := json.Unmarshal(buf[:n], &m); err != nil || m.Op != "setup" || m.Setup == nil {
		return fail(errors.New("the first message is not a setup"))
	}
	if err := buildRoot(m.Setup); err != nil {
		return fail(err)
	}
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fail(fmt.Errorf("cgroup namespace: %w", err))
	}
	if !m.Setup.Network {
		if err := loopbackUp(); err != nil {
			return fail(err)
		}
	}
	if err := dropPrivileges(m.Setup.Filter); err != nil {
		return fail(err)
	}
	err = unix.Exec("/proc/self/fd/"+strconv.Itoa(ExeFd), []string{Name, StageRun}, os.Environ())
	return fail(fmt.Errorf("execute the init: %w", err))
}

// buildRoot makes the sandbox's root from s.Ops on a read-only tmpfs and
// pivots into it, leaving nothing of the host's root reachable, then
// changes to s.Cwd.
func buildRoot(s *Setup) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make the mounts private: %w", err)
	}
	// A scratch root that holds the host's old one and the new one.
	if err := unix.Mount("tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("scratch root: %w", err)
	}
	for _, d := range []string{"/tmp" + oldRoot, "/tmp" + newRoot} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("scratch root: %w", err)
		}
	}
	if err := unix.PivotRoot("/tmp", "/tmp"+oldRoot); err != nil {
		return fmt.Errorf("pivot to the scratch root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", newRoot, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=1m"); err != nil {
		return fmt.Errorf("the sandbox's root: %w", err)
	}
	for _, op := range s.Ops {
		if err := applyOp(op); err != nil {
			return fmt.Errorf("%s %s at %s: %w", op.Kind, op.Src, op.Dst, err)
		}
	}
	if err := setattr(newRoot, false, unix.MOUNT_ATTR_RDONLY); err != nil {
		return fmt.Errorf("make the sandbox's root read-only: %w", err)
	}
	if err := unix.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot to the sandbox's root: %w", err)
	}
	// The scratch root, and the host's under it, now sit over the new
	// root: detached, nothing of them is reachable.
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host's root: %w", err)
	}
	if err := unix.Chdir(s.Cwd); err != nil {
		return fmt.Errorf("cwd %s: %w", s.Cwd, err)
	}
	return nil
}

// applyOp performs one step of the root under newRoot.
func applyOp(op MountOp) error {
	dst := newRoot + op.Dst
	switch op.Kind {
	case OpROBind, OpBind:
		src := oldRoot + op.Src
		fi, err := os.Stat(src)
		if err != nil {
			return err
		}
		if err := mountPoint(dst, fi.IsDir()); err != nil {
			return err
		}
		if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return err
		}
		attr := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
		if op.Kind == OpROBind {
			attr |= unix.MOUNT_ATTR_RDONLY
		}
		return setattr(dst, true, attr)
	case OpSymlink:
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		return os.Symlink(op.Src, dst)
	case OpHideDir:
		if err := mountPoint(dst, true); err != nil {
			return err
		}
		if err := unix.Mount("tmpfs", dst, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=4k"); err != nil {
			return err
		}
		return setattr(dst, false, unix.MOUNT_ATTR_RDONLY)
	case OpTmp:
		if err := mountPoint(dst, true); err != nil {
			return err
		}
		return unix.Mount("tmpfs", dst, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777")
	case OpProc:
		if err := mountPoint(dst, true); err != nil {
			return err
		}
		if err := unix.Mount("proc", dst, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return err
		}
		// Root of this user namespace may make no other (and so gains no
		// capability anywhere): its limit is its own to set.
		if err := os.WriteFile(dst+"/sys/user/max_user_namespaces", []byte("0"), 0); err != nil {
			return fmt.Errorf("forbid user namespaces: %w", err)
		}
		// What in /proc would change the kernel is read-only (root of a
		// user namespace writes only its own namespaces' settings there).
		for _, p := range []string{"sys", "sysrq-trigger", "irq", "bus"} {
			if _, err := os.Lstat(dst + "/" + p); err != nil {
				continue
			}
			if err := unix.Mount(dst+"/"+p, dst+"/"+p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
				return err
			}
			if err := setattr(dst+"/"+p, true, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV); err != nil {
				return err
			}
		}
		return nil
	case OpDev:
		return makeDev(dst)
	}
	return fmt.Errorf("unknown kind %q", op.Kind)
}

// makeDev makes a minimal /dev at dst: the host's null, zero, full,
// random, urandom and tty, the usual links, a private devpts and /dev/shm.
func makeDev(dst string) error {
	if err := mountPoint(dst, true); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dst, "tmpfs", unix.MS_NOSUID, "mode=0755,size=64k"); err != nil {
		return err
	}
	for _, n := range devNodes {
		if err := mountPoint(dst+"/"+n, false); err != nil {
			return err
		}
		if err := unix.Mount(oldRoot+"/dev/"+n, dst+"/"+n, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("/dev/%s: %w", n, err)
		}
		if err := setattr(dst+"/"+n, false, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC); err != nil {
			return err
		}
	}
	for name, target := range map[string]string{
		"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
		"stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx", "core": "/proc/kcore",
	} {
		if err := os.Symlink(target, dst+"/"+name); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dst+"/shm", 0o1777); err != nil {
		return err
	}
	if err := os.Chmod(dst+"/shm", 0o1777); err != nil {
		return err
	}
	if err := os.Mkdir(dst+"/pts", 0o755); err != nil {
		return err
	}
	if err := unix.Mount("devpts", dst+"/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620"); err != nil {
		return fmt.Errorf("devpts: %w", err)
	}
	return nil
}

// mountPoint makes an empty directory (or file) at p to mount on, with its
// parents.
func mountPoint(p string, dir bool) error {
	if dir {
		return os.MkdirAll(p, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDONLY, 0o444)
	if err != nil {
		return err
	}
	return f.Close()
}

// setattr sets attr on the mount at p (and every mount under it when
// recursive).
func setattr(p string, recursive bool, attr uint64) error {
	flags := uint(0)
	if recursive {
		flags = unix.AT_RECURSIVE
	}
	return unix.MountSetattr(unix.AT_FDCWD, p, flags, &unix.MountAttr{Attr_set: attr})
}

// loopbackUp brings the sandbox's own loopback interface up.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	return nil
}

// dropPrivileges leaves the calling thread (and what it executes) no
// capability, in any set, and no way to gain one (no_new_privs; root's
// execve then grants nothing, the bounding set being empty), under the
// syscall filter prog when there is one.
func dropPrivileges(prog []byte) error {
	last, err := lastCap()
	if err != nil {
		return err
	}
	for c := 0; c <= last; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear the ambient capabilities: %w", err)
	}
	var data [2]unix.CapUserData
	if err := unix.Capset(&unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}, &data[0]); err != nil {
		return fmt.Errorf("drop the capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if len(prog) == 0 {
		return nil
	}
	if len(prog)%8 != 0 {
		return errors.New("the syscall filter is not a whole number of instructions")
	}
	filter := unsafe.Slice((*unix.SockFilter)(unsafe.Pointer(&prog[0])), len(prog)/8)
	fprog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&fprog)), 0, 0); err != nil {
		return fmt.Errorf("load the syscall filter: %w", err)
	}
	return nil
}

// lastCap is the kernel's highest capability number.
func lastCap() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("capabilities: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("capabilities: %w", err)
	}
	return n, nil
}

// The rlimits every command runs under, cgroups or not.
const (
	RlimitNofile = 4096
	// RlimitFsize bounds one file's size (256 MiB).
	RlimitFsize = 256 << 20
)

// SetRlimits sets process pid's rlimits (0: the caller's own): no core
// files, RlimitNofile open files, files of at most RlimitFsize bytes, hard
// and soft.
func SetRlimits(pid int) error {
	for _, l := range []struct {
		res int
		max uint64
	}{{unix.RLIMIT_CORE, 0}, {unix.RLIMIT_NOFILE, RlimitNofile}, {unix.RLIMIT_FSIZE, RlimitFsize}} {
		if err := unix.Prlimit(pid, l.res, &unix.Rlimit{Cur: l.max, Max: l.max}, nil); err != nil {
			return fmt.Errorf("set rlimit %d: %w", l.res, err)
		}
	}
	return nil
}
