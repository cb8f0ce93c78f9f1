package local

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/sandboxowner/owner/provider/local/sinit"
)

// DefaultUID and DefaultGID are the host ids sandboxed commands run as
// (nobody and nogroup on most distributions).
const (
	DefaultUID = 65534
	DefaultGID = 65534
)

// DefaultROBinds are the host directories a sandbox sees, read-only: what
// shells, compilers and interpreters installed by the distribution need.
// Entries missing on the host are skipped; symlinks (/bin -> usr/bin) are
// shown as the same symlinks.
var defaultROBinds = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"}

// neverBound are host directories no option may show a sandbox: homes,
// variable state (sockets, databases, logs), services' data, runtime
// sockets and the host's /tmp.
var neverBound = []string{"/root", "/home", "/var", "/srv", "/run", "/tmp", "/proc", "/sys", "/dev", "/boot", "/mnt", "/media"}

// containerConfig is what every sandbox's container shares: who it runs
// as, the host directories it sees, and its syscall filter.
type containerConfig struct {
	uid, gid int
	// view shows the allow-listed host directories read-only over an
	// empty read-only root, and hides what must stay hidden under them.
	view []sinit.MountOp
	// bound are the host paths shown (directories bound, and symlinks).
	bound []string
	// rootless: the server is not root and uid is its own.
	rootless bool
	// seccomp is the compiled syscall filter of every sandbox (nil: none),
	// which its init loads last, before it starts any command.
	seccomp []byte
}

// newContainerConfig builds the sandbox's view of the host:
// defaultROBinds and roBinds, read-only, with hide masked wherever a bound
// directory holds them. A hidden file is shown as the empty file mask (a
// device node such as /dev/null cannot be opened on a user namespace's
// mounts); a hidden directory as an empty read-only tmpfs.
func newContainerConfig(uid, gid int, roBinds, hide []string, mask string) (*containerConfig, error) {
	cfg := &containerConfig{uid: uid, gid: gid}
	for _, p := range defaultROBinds {
		fi, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			if err != nil {
				continue
			}
			cfg.view = append(cfg.view, sinit.MountOp{Kind: sinit.OpSymlink, Src: target, Dst: p})
			cfg.bound = append(cfg.bound, p)
			continue
		}
		if fi.IsDir() {
			cfg.view = append(cfg.view, sinit.MountOp{Kind: sinit.OpROBind, Src: p, Dst: p})
			cfg.bound = append(cfg.bound, p)
		}
	}
	extra := slices.Clone(roBinds)
	slices.Sort(extra) // parents before children
	for _, p := range extra {
		if err := checkROBind(p, hide); err != nil {
			return nil, err
		}
		cfg.view = append(cfg.view, sinit.MountOp{Kind: sinit.OpROBind, Src: p, Dst: p})
		cfg.bound = append(cfg.bound, p)
	}
	for _, h := range hide {
		if !cfg.shows(h) {
			continue
		}
		fi, err := os.Stat(h)
		switch {
		case err != nil:
			continue
		case fi.IsDir():
			cfg.view = append(cfg.view, sinit.MountOp{Kind: sinit.OpHideDir, Dst: h})
		default:
			cfg.view = append(cfg.view, sinit.MountOp{Kind: sinit.OpROBind, Src: mask, Dst: h})
		}
	}
	cfg.view = append(cfg.view, sinit.MountOp{Kind: sinit.OpDev, Dst: "/dev"}, sinit.MountOp{Kind: sinit.OpProc, Dst: "/proc"}, sinit.MountOp{Kind: sinit.OpTmp, Dst: "/tmp"})
	return cfg, nil
}

// errBadROBind: a sandbox.local.ro_binds entry that cannot be shown.
var errBadROBind = errors.New("read-only bind")

// checkROBind refuses a bind that is not an absolute, existing directory or
// file, or that would show what a sandbox must never see.
func checkROBind(p string, hide []string) error {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
		return fmt.Errorf("%w %q: want a clean absolute path other than /", errBadROBind, p)
	}
	for _, n := range neverBound {
		if within(p, n) || within(n, p) {
			return fmt.Errorf("%w %q: %s is never shown to a sandbox", errBadROBind, p, n)
		}
	}
	for _, h := range hide {
		if within(p, h) {
			return fmt.Errorf("%w %q: it is inside %s, which a sandbox must never see", errBadROBind, p, h)
		}
	}
	if _, err := os.Stat(p); err != nil {
		return fmt.Errorf("%w %q: %v", errBadROBind, p, err)
	}
	return nil
}

// shows reports whether host path h is visible in the sandbox's view.
func (c *containerConfig) shows(h string) bool {
	for _, b := range c.bound {
		if within(h, b) {
			return true
		}
	}
	return false
}

// setup is what the init of a sandbox whose tree is fsDir, mounted at
// workdir, builds (see sinit.RunSetup): the host view, the tree, then the
// sandbox's caches and mounts.
func (c *containerConfig) setup(fsDir, workdir string, network bool, mounts []cacheMount) *sinit.Setup {
	ops := make([]sinit.MountOp, 0, len(c.view)+1+len(mounts))
	ops = append(ops, c.view...)
	ops = append(ops, sinit.MountOp{Kind: sinit.OpBind, Src: fsDir, Dst: workdir})
	for _, m := range mounts {
		kind := sinit.OpBind
		if m.ro {
			kind = sinit.OpROBind
		}
		ops = append(ops, sinit.MountOp{Kind: kind, Src: m.host, Dst: path.Clean(m.path)})
	}
	return &sinit.Setup{Ops: ops, Cwd: workdir, Network: network, Filter: c.seccomp}
}

// sysProcAttr starts a sandbox's init in new user, mount, pid, ipc and
// uts namespaces (and network, unless network), in a process group of its
// own, killed when the server dies. Its user namespace maps root to the
// unprivileged host uid and gid, with no supplementary groups: nothing of
// the sandbox runs as host root.
//
// With ids (a sandbox's uid of its own) the namespace is made by the
// server's thread holding those ids as its effective ones (see
// startJoined), so it is theirs: the kernel counts what the sandbox holds
// per user (inotify and fanotify instances, user namespaces) against them,
// never against root. Such a namespace's maps are written as they allow
// (setgroups denied; the thread has no supplementary groups).
func (c *containerConfig) sysProcAttr(network bool, ids *owner) *syscall.SysProcAttr {
	flags := uintptr(syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS)
	if !network {
		flags |= syscall.CLONE_NEWNET
	}
	a := &syscall.SysProcAttr{
		Setpgid:     true,
		Pdeathsig:   syscall.SIGKILL,
		Cloneflags:  flags,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: c.uid, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: c.gid, Size: 1}},
	}
	switch {
	case ids != nil:
		a.UidMappings[0].HostID, a.GidMappings[0].HostID = ids.uid, ids.gid
		a.Credential = &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true}
	case !c.rootless:
		// Only root may allow setgroups while mapping another gid; it
		// drops every supplementary group.
		a.GidMappingsEnableSetgroups = true
		a.Credential = &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{}}
	}
	return a
}

// checkWorkdir refuses a workdir the tree cannot be mounted at: one
// under /proc or /dev, one that would hide a bound host directory, or one
// inside a bound directory that has no such directory on the host.
func (c *containerConfig) checkWorkdir(workdir string) error {
	top := strings.SplitN(strings.TrimPrefix(workdir, "/"), "/", 2)[0]
	switch top {
	case "proc", "dev":
		return fmt.Errorf("workdir %q is under /%s", workdir, top)
	case "tmp":
		return nil
	}
	for _, b := range c.bound {
		if within(b, workdir) {
			return fmt.Errorf("workdir %q would hide the host's %s", workdir, b)
		}
		if within(workdir, b) {
			fi, err := os.Stat(filepath.FromSlash(workdir))
			if err != nil || !fi.IsDir() {
				return fmt.Errorf("workdir %q: %s is the host's, read-only, and has no directory %s to mount the sandbox at", workdir, b, path.Clean(workdir))
			}
			return nil
		}
	}
	return nil // made on the sandbox's tmpfs root
}
