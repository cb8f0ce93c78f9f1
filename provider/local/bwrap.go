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
	"sort"
	"strings"
	"time"
)

// bwrapConfig is what every bubblewrap command line shares: the binary, and
// how the host's root is shown read-only.
type bwrapConfig struct {
	bin string
	// hostArgs show each top-level entry of the host's / read-only (so that
	// the sandbox's root is a tmpfs where any workdir can be made), with a
	// fresh /dev, /proc and /tmp, and the provider's root hidden.
	hostArgs []string
	// roEntries are the top-level host entries bound read-only, by name.
	roEntries map[string]bool
}

// capsKept are the capabilities a sandbox's root keeps: Docker's default set.
// CAP_SYS_ADMIN in particular is dropped, so a command cannot remount the host
// read-write.
const capsKept = "CAP_CHOWN CAP_DAC_OVERRIDE CAP_FSETID CAP_FOWNER CAP_MKNOD " +
	"CAP_NET_RAW CAP_SETGID CAP_SETUID CAP_SETFCAP CAP_SETPCAP " +
	"CAP_NET_BIND_SERVICE CAP_SYS_CHROOT CAP_KILL CAP_AUDIT_WRITE"

func newBwrapConfig(bin, root string) (*bwrapConfig, error) {
	if bin == "" {
		bin = "bwrap"
	}
	full, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("find bubblewrap: %w", err)
	}
	entries, err := os.ReadDir("/")
	if err != nil {
		return nil, fmt.Errorf("read /: %w", err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	cfg := &bwrapConfig{bin: full, roEntries: map[string]bool{}}
	for _, name := range names {
		switch name {
		case "proc", "dev", "tmp":
			continue
		}
		host := "/" + name
		fi, err := os.Lstat(host)
		if err != nil {
			continue
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(host)
			if err != nil {
				continue
			}
			cfg.hostArgs = append(cfg.hostArgs, "--symlink", target, host)
			continue
		}
		cfg.hostArgs = append(cfg.hostArgs, "--ro-bind", host, host)
		cfg.roEntries[name] = true
	}
	cfg.hostArgs = append(cfg.hostArgs, "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", root)
	return cfg, nil
}

// args returns bwrap's arguments for a command in the tree fsDir mounted at
// workdir, starting in cwd (a path in the sandbox's view).
// extra are more mount arguments (the caches' binds), after the tree's.
func (c *bwrapConfig) args(fsDir, workdir, cwd string, network bool, command string, extra ...string) []string {
	a := make([]string, 0, len(c.hostArgs)+40+len(extra))
	a = append(a, c.hostArgs...)
	a = append(a, "--bind", fsDir, workdir)
	a = append(a, extra...)
	a = append(a, "--remount-ro", "/", "--chdir", cwd,
		"--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
		"--die-with-parent", "--cap-drop", "ALL")
	for _, c := range strings.Fields(capsKept) {
		a = append(a, "--cap-add", c)
	}
	if !network {
		a = append(a, "--unshare-net")
	}
	return append(a, "--", "/bin/sh", "-c", command)
}

// checkWorkdir refuses a workdir bubblewrap cannot mount the tree at: one
// whose top-level directory exists on the host (bound read-only) but which
// does not itself exist there, or one under /proc or /dev.
func (c *bwrapConfig) checkWorkdir(workdir string) error {
	top := strings.SplitN(strings.TrimPrefix(workdir, "/"), "/", 2)[0]
	switch top {
	case "proc", "dev":
		return fmt.Errorf("workdir %q is under /%s", workdir, top)
	case "tmp":
		return nil
	}
	if !c.roEntries[top] {
		fi, err := os.Lstat("/" + top)
		if err == nil && !fi.IsDir() {
			return fmt.Errorf("workdir %q: /%s is not a directory on the host", workdir, top)
		}
		return nil // made on the sandbox's tmpfs root
	}
	fi, err := os.Stat(filepath.FromSlash(workdir))
	if err != nil || !fi.IsDir() {
		return fmt.Errorf("workdir %q: /%s is the host's, read-only, and has no directory %s to mount the sandbox at", workdir, top, path.Clean(workdir))
	}
	return nil
}

// probe runs `true` the way commands will run, so that "auto" falls back
// when bubblewrap is installed but cannot make namespaces here.
func (c *bwrapConfig) probe(parent string) error {
	dir, err := os.MkdirTemp(parent, "bwrap-probe-")
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, c.args(dir, DefaultWorkdir, DefaultWorkdir, false, "touch probe")...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("probe %s: %w: %s", c.bin, err, strings.TrimSpace(stderr.String()))
	}
	if _, err := os.Stat(filepath.Join(dir, "probe")); err != nil {
		return errors.New("probe: a command under bubblewrap could not write its workdir")
	}
	return nil
}
