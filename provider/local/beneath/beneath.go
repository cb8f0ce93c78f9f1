// Package beneath resolves paths inside a sandbox's tree for the server's
// own work in it (the files API, snapshot copies, a command's working
// directory), which runs as root on a tree a hostile command may be
// changing at the same moment. It never resolves a path the tree holds by
// name from the host's root: it opens the tree's top once and walks down
// with directory file descriptors, refusing symlinks (openat2 with
// RESOLVE_BENEATH and RESOLVE_NO_SYMLINKS where the kernel has it,
// O_NOFOLLOW one component at a time otherwise), so a link swapped in
// between a check and a use cannot lead it elsewhere. Its decisions are
// tested on a temporary directory in milliseconds, apart from the
// sandboxes that use them.
package beneath

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/provider"
)

// Rel turns a path in the sandbox's view (relative to workdir, or
// absolute under it) into a slash path relative to the tree's top, refusing
// one that leaves the tree by its spelling. Symlinks are refused by the walk
// (Open).
func Rel(workdir, p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("empty path: %w", provider.ErrPathEscape)
	}
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("path %q holds a NUL: %w", p, provider.ErrPathEscape)
	}
	if path.IsAbs(p) {
		c := path.Clean(p)
		switch {
		case c == workdir:
			return ".", nil
		case strings.HasPrefix(c, workdir+"/"):
			return c[len(workdir)+1:], nil
		default:
			return "", fmt.Errorf("path %q is outside the workdir %s: %w", p, workdir, provider.ErrPathEscape)
		}
	}
	c := path.Clean(p)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("path %q leaves the workdir: %w", p, provider.ErrPathEscape)
	}
	return c, nil
}

// OpenTree opens the top of a sandbox's tree.
func OpenTree(fsDir string) (int, error) {
	fd, err := unix.Open(fsDir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return -1, fmt.Errorf("local: open sandbox tree: %w", err)
	}
	return fd, nil
}

// Open opens rel (a clean relative slash path, "." for the top)
// under the directory dirfd with flags, following no symlink and never
// leaving dirfd. A symlink on the way is ErrPathEscape.
func Open(dirfd int, rel string, flags int) (int, error) {
	flags |= unix.O_CLOEXEC
	if rel == "." || rel == "" {
		return unix.Openat(dirfd, ".", flags, 0)
	}
	// RESOLVE_NO_SYMLINKS refuses a trailing symlink too (ELOOP).
	how := unix.OpenHow{Flags: uint64(flags), Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	fd, err := unix.Openat2(dirfd, rel, &how)
	if !errors.Is(err, unix.ENOSYS) {
		return fd, err
	}
	return openByParts(dirfd, rel, flags)
}

// openByParts is Open where the kernel has no openat2: one
// component at a time, each with O_NOFOLLOW.
func openByParts(dirfd int, rel string, flags int) (int, error) {
	parts := strings.Split(rel, "/")
	cur, owned := dirfd, false
	defer func() {
		if owned {
			unix.Close(cur)
		}
	}()
	open := func(part string, f int) (int, error) {
		if part == ".." {
			return -1, unix.EXDEV
		}
		fd, err := unix.Openat(cur, part, f|unix.O_NOFOLLOW, 0)
		if err != nil {
			return -1, LinkErr(cur, part, err)
		}
		return fd, nil
	}
	last := len(parts) - 1
	for _, part := range parts[:last] {
		next, err := open(part, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC)
		if err != nil {
			return -1, err
		}
		if owned {
			unix.Close(cur)
		}
		cur, owned = next, true
	}
	return open(parts[last], flags)
}

// PathErr words an error of a walk in the tree, keeping its errno for
// callers (and the sandbox API) to branch on: a symlink on the way (ELOOP)
// or a climb out (EXDEV) is ErrPathEscape.
func PathErr(op, rel string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return fmt.Errorf("local: %s %q: the path goes through a symlink, which file calls never follow: %w", op, rel, provider.ErrPathEscape)
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("local: %s %q: %w", op, rel, os.ErrNotExist)
	}
	return fmt.Errorf("local: %s %q: %w", op, rel, err)
}

// LinkErr turns the ENOTDIR that opening a symlink with O_DIRECTORY and
// O_NOFOLLOW gives into ELOOP, so that a symlink reads as one.
func LinkErr(dirfd int, name string, err error) error {
	if !errors.Is(err, unix.ENOTDIR) {
		return err
	}
	var st unix.Stat_t
	if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return unix.ELOOP
	}
	return err
}

// Owner is who the directories MakeDirs makes belong to.
type Owner struct{ UID, GID int }

// MakeDirs opens the directory rel under top, making what is
// missing (owned by own), one component at a time without following links.
func MakeDirs(top int, rel string, own *Owner) (int, error) {
	cur, err := unix.Dup(top)
	if err != nil {
		return -1, err
	}
	if rel == "." {
		return cur, nil
	}
	for _, part := range strings.Split(rel, "/") {
		next, err := unix.Openat(cur, part, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			if err = unix.Mkdirat(cur, part, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				if err == nil && own != nil {
					err = unix.Fchownat(cur, part, own.UID, own.GID, unix.AT_SYMLINK_NOFOLLOW)
				}
				if err == nil || errors.Is(err, unix.EEXIST) {
					next, err = unix.Openat(cur, part, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				}
			}
		}
		if err != nil {
			err = LinkErr(cur, part, err)
		}
		unix.Close(cur)
		if err != nil {
			return -1, err
		}
		cur = next
	}
	return cur, nil
}
