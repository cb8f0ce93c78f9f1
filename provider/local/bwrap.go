package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
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

// bwrapConfig is what every bubblewrap command line shares.
type bwrapConfig struct {
	bin      string
	uid, gid int
	// hostArgs show the allow-listed host directories read-only over a
	// tmpfs root, hide what must stay hidden under them, and give the
	// sandbox a fresh /dev, /proc and /tmp.
	hostArgs []string
	// bound are the host paths shown (directories bound, and symlinks).
	bound []string
	// rootless: the server is not root and uid is its own.
	rootless bool
	// seccomp is the compiled syscall filter of every command (nil: none),
	// handed to bubblewrap at fd 3, which loads it last, just before the
	// command runs.
	seccomp []byte
}

// newBwrapConfig finds bubblewrap and builds the sandbox's view of the
// host: defaultROBinds and roBinds, read-only, with hide masked wherever a
// bound directory holds them.
// A hidden file is shown as the empty file mask (a device node such as
// /dev/null cannot be opened on a user namespace's mounts).
func newBwrapConfig(bin string, uid, gid int, roBinds, hide []string, mask string) (*bwrapConfig, error) {
	if bin == "" {
		bin = "bwrap"
	}
	full, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("find bubblewrap: %w", err)
	}
	cfg := &bwrapConfig{bin: full, uid: uid, gid: gid}
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
			cfg.hostArgs = append(cfg.hostArgs, "--symlink", target, p)
			cfg.bound = append(cfg.bound, p)
			continue
		}
		if fi.IsDir() {
			cfg.hostArgs = append(cfg.hostArgs, "--ro-bind", p, p)
			cfg.bound = append(cfg.bound, p)
		}
	}
	extra := slices.Clone(roBinds)
	slices.Sort(extra) // parents before children
	for _, p := range extra {
		if err := checkROBind(p, hide); err != nil {
			return nil, err
		}
		cfg.hostArgs = append(cfg.hostArgs, "--ro-bind", p, p)
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
			cfg.hostArgs = append(cfg.hostArgs, "--tmpfs", h)
		default:
			cfg.hostArgs = append(cfg.hostArgs, "--ro-bind", mask, h)
		}
	}
	cfg.hostArgs = append(cfg.hostArgs, "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp")
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
func (c *bwrapConfig) shows(h string) bool {
	for _, b := range c.bound {
		if within(h, b) {
			return true
		}
	}
	return false
}

// args returns bwrap's arguments for a command in the tree fsDir mounted at
// workdir, starting in cwd (a path in the sandbox's view), with exactly the
// environment env: /bin/sh -c command. extra are more mount arguments (the
// caches' binds), after the tree's.
//
// bwrap itself runs in a user namespace made by the server (see
// sysProcAttr) in which it is root; it makes a nested one for the command,
// mapping root to the same unprivileged host uid, drops every capability
// (effective, permitted, inheritable, ambient and bounding), sets
// no_new_privs, and forbids further user namespaces.
func (c *bwrapConfig) args(fsDir, workdir, cwd string, network bool, env []string, command string, extra ...string) []string {
	return append(c.sandboxArgs(fsDir, workdir, cwd, network, env, 3, extra...), "--", "/bin/sh", "-c", command)
}

// initArgs are bwrap's arguments for a sandbox's init (see runInit), which
// the extra arguments bind at initPath: the sandbox's pid 1, with the
// syscall filter at fd 5.
func (c *bwrapConfig) initArgs(fsDir, workdir string, network bool, env []string, extra ...string) []string {
	return append(c.sandboxArgs(fsDir, workdir, workdir, network, env, 5, extra...), "--as-pid-1", "--", initPath)
}

// sandboxArgs are the arguments args and initArgs share; the filter, when
// there is one, is read from fd filterFd.
func (c *bwrapConfig) sandboxArgs(fsDir, workdir, cwd string, network bool, env []string, filterFd int, extra ...string) []string {
	a := make([]string, 0, len(c.hostArgs)+40+len(extra)+3*len(env))
	a = append(a, "--unshare-user", "--disable-userns", "--uid", "0", "--gid", "0")
	a = append(a, c.hostArgs...)
	a = append(a, "--bind", fsDir, workdir)
	a = append(a, extra...)
	a = append(a, "--remount-ro", "/", "--chdir", cwd,
		"--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
		"--die-with-parent", "--cap-drop", "ALL", "--clearenv")
	if c.seccomp != nil {
		a = append(a, "--seccomp", strconv.Itoa(filterFd))
	}
	if !network {
		a = append(a, "--unshare-net")
	}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		a = append(a, "--setenv", k, v)
	}
	return a
}

// sysProcAttr starts bwrap in a new user namespace whose root is the
// unprivileged host uid and gid, with no supplementary groups: nothing of
// the sandbox, bwrap included, runs as host root.
func (c *bwrapConfig) sysProcAttr() *syscall.SysProcAttr {
	if c.rootless {
		// A process that is not root may map only its own ids, and must
		// deny setgroups to map its gid.
		return &syscall.SysProcAttr{
			Setpgid:     true,
			Pdeathsig:   syscall.SIGKILL,
			Cloneflags:  syscall.CLONE_NEWUSER,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: c.uid, Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: c.gid, Size: 1}},
		}
	}
	return &syscall.SysProcAttr{
		Setpgid:                    true,
		Pdeathsig:                  syscall.SIGKILL,
		Cloneflags:                 syscall.CLONE_NEWUSER,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: c.uid, Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: c.gid, Size: 1}},
		GidMappingsEnableSetgroups: true,
		Credential:                 &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{}},
	}
}

// hostEnv is bubblewrap's own environment: fixed, so that nothing in a
// request changes how the host side starts. id marks the process as the
// sandbox's (see killMarked).
func hostEnv(id string) []string {
	return []string{"PATH=" + basePath, "LANG=C.UTF-8", SandboxIDEnv + "=" + id}
}

// checkWorkdir refuses a workdir bubblewrap cannot mount the tree at: one
// under /proc or /dev, one that would hide a bound host directory, or one
// inside a bound directory that has no such directory on the host.
func (c *bwrapConfig) checkWorkdir(workdir string) error {
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

// attachFilter hands cmd the syscall filter at fd 3 (see args); the
// returned func closes the server's copy once cmd has started.
func (c *bwrapConfig) attachFilter(cmd *exec.Cmd) (func(), error) {
	if c.seccomp == nil {
		return func() {}, nil
	}
	f, err := filterFile(c.seccomp)
	if err != nil {
		return nil, err
	}
	cmd.ExtraFiles = []*os.File{f}
	return func() { f.Close() }, nil
}

// probe runs `touch` the way commands will run, so that "auto" falls back
// when bubblewrap is installed but cannot make namespaces here, or cannot
// reach the provider's root as the sandbox's uid.
func (c *bwrapConfig) probe(parent string) error {
	dir, err := os.MkdirTemp(parent, "bwrap-probe-")
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chown(dir, c.uid, c.gid); err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, c.args(dir, DefaultWorkdir, DefaultWorkdir, false, []string{"PATH=" + basePath}, "touch probe")...)
	cmd.Env = hostEnv("probe")
	cmd.SysProcAttr = c.sysProcAttr()
	closeFilter, err := c.attachFilter(cmd)
	if err != nil {
		return err
	}
	defer closeFilter()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("probe %s as uid %d: %w: %s", c.bin, c.uid, err, strings.TrimSpace(stderr.String()))
	}
	if _, err := os.Stat(filepath.Join(dir, "probe")); err != nil {
		return errors.New("probe: a command under bubblewrap could not write its workdir")
	}
	return nil
}

// searchable makes dir and each of its ancestors searchable (o+x) by the
// sandbox's uid, which bubblewrap runs as: it must reach the trees it binds.
// Only the search bit is added, never read or write; it returns the
// directories it changed.
func searchable(dir string, uid, gid int) ([]string, error) {
	var changed []string
	p := filepath.Clean(dir)
	var chain []string
	for {
		chain = append(chain, p)
		if p == "/" {
			break
		}
		p = filepath.Dir(p)
	}
	for i := len(chain) - 1; i >= 0; i-- {
		d := chain[i]
		fi, err := os.Stat(d)
		if err != nil {
			return changed, err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			continue
		}
		m := fi.Mode().Perm()
		if m&0o001 != 0 || (int(st.Uid) == uid && m&0o100 != 0) || (int(st.Gid) == gid && m&0o010 != 0) {
			continue
		}
		if err := os.Chmod(d, fi.Mode().Perm()|0o001|fi.Mode()&(os.ModeSetgid|os.ModeSticky)); err != nil {
			return changed, err
		}
		changed = append(changed, d)
	}
	return changed, nil
}
