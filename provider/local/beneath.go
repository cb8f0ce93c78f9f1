package local

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/provider"
)

// The server's own work in a sandbox's tree (the files API, snapshot
// copies) runs as root on a tree a hostile command may be changing at the
// same moment. It never resolves a path the tree holds by name from the
// host's root: it opens the tree's top once and walks down with directory
// file descriptors, refusing symlinks (openat2 with RESOLVE_BENEATH and
// RESOLVE_NO_SYMLINKS where the kernel has it, O_NOFOLLOW one component at
// a time otherwise), so a link swapped in between a check and a use cannot
// lead it elsewhere.

// openTree opens the top of a sandbox's tree.
func openTree(fsDir string) (int, error) {
	fd, err := unix.Open(fsDir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return -1, fmt.Errorf("local: open sandbox tree: %w", err)
	}
	return fd, nil
}

// openBeneath opens rel (a clean relative slash path, "." for the top)
// under the directory dirfd with flags, following no symlink and never
// leaving dirfd. A symlink on the way is ErrPathEscape.
func openBeneath(dirfd int, rel string, flags int) (int, error) {
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

// openByParts is openBeneath where the kernel has no openat2: one
// component at a time, each with O_NOFOLLOW.
func openByParts(dirfd int, rel string, flags int) (int, error) {
	flags |= unix.O_NOFOLLOW
	parts := strings.Split(rel, "/")
	cur, owned := dirfd, false
	defer func() {
		if owned {
			unix.Close(cur)
		}
	}()
	for i, part := range parts {
		if part == ".." {
			return -1, unix.EXDEV
		}
		f := unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW
		if i == len(parts)-1 {
			f = flags
		}
		next, err := unix.Openat(cur, part, f, 0)
		if err != nil {
			return -1, linkErr(cur, part, err)
		}
		if i == len(parts)-1 {
			return next, nil
		}
		if owned {
			unix.Close(cur)
		}
		cur, owned = next, true
	}
	return -1, unix.EINVAL
}

// pathErr words an error of a walk in the tree, keeping its errno for
// callers (and the sandbox API) to branch on: a symlink on the way (ELOOP)
// or a climb out (EXDEV) is ErrPathEscape.
func pathErr(op, rel string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return fmt.Errorf("local: %s %q: the path goes through a symlink, which file calls never follow: %w", op, rel, provider.ErrPathEscape)
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("local: %s %q: %w", op, rel, os.ErrNotExist)
	}
	return fmt.Errorf("local: %s %q: %w", op, rel, err)
}

// linkErr turns the ENOTDIR that opening a symlink with O_DIRECTORY and
// O_NOFOLLOW gives into ELOOP, so that a symlink reads as one.
func linkErr(dirfd int, name string, err error) error {
	if !errors.Is(err, unix.ENOTDIR) {
		return err
	}
	var st unix.Stat_t
	if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return unix.ELOOP
	}
	return err
}
