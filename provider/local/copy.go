package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/provider/local/beneath"
)

// ficlone is the FICLONE ioctl: make dst share src's blocks (a reflink).
const ficlone = 0x40049409

// seekData and seekHole are lseek's SEEK_DATA and SEEK_HOLE.
const (
	seekData = 3
	seekHole = 4
)

// copyTree copies the directory src to dst (which must not exist) the way
// `cp -a` does: modes, owners, times, extended attributes (so overlayfs
// whiteouts and opaque directories survive), symlinks as symlinks, hard
// links and holes in sparse files. FIFOs, sockets and devices other than
// whiteouts are skipped: nothing in a sandbox's tree needs them and a copy
// must not make device nodes. Regular files are copied by `workers`
// goroutines, each file as a reflink where the filesystem has them and by
// copy_file_range otherwise. A non-nil as owns every copy instead.
//
// src may be a tree a hostile command is changing while it is copied: it
// is walked with directory file descriptors, every entry opened with
// O_NOFOLLOW and judged by what was opened (fstat), so no symlink swapped
// in can take the copy outside src.
func copyTree(ctx context.Context, src, dst string, workers int, as *owner) error {
	return copyTreeHooked(ctx, src, dst, workers, as, nil)
}

// copyTreeHooked is copyTree with a hook called with each entry's path
// (relative to src) between its lstat and its open: tests swap it there.
func copyTreeHooked(ctx context.Context, src, dst string, workers int, as *owner, beforeOpen func(rel string)) error {
	c := &treeCopier{links: map[[2]uint64]string{}, euid: os.Geteuid(), egid: os.Getegid(), as: as, beforeOpen: beforeOpen}
	c.reflink.Store(true)
	return c.run(ctx, src, dst, workers)
}

type treeCopier struct {
	reflink    atomic.Bool
	links      map[[2]uint64]string // (dev, inode) of a hard-linked file -> its copy; walker only
	euid, egid int
	as         *owner
	beforeOpen func(rel string)
}

type copyJob struct {
	in  *os.File
	dst string
	st  *syscall.Stat_t
}

type dirFix struct {
	dst string
	st  *syscall.Stat_t
}

func (c *treeCopier) run(ctx context.Context, src, dst string, workers int) error {
	top, err := unix.Open(src, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	defer unix.Close(top)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		firstErr error
		errOnce  sync.Once
	)
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err; cancel() })
	}
	jobs := make(chan copyJob, 256)
	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Go(func() {
			for j := range jobs {
				if ctx.Err() == nil {
					if err := c.copyFile(j.in, j.dst, j.st); err != nil {
						fail(err)
					}
				}
				j.in.Close()
			}
		})
	}
	var dirs []dirFix
	walkErr := c.copyDir(ctx, top, ".", dst, jobs, &dirs)
	close(jobs)
	wg.Wait()
	if walkErr != nil {
		fail(walkErr)
	}
	if firstErr != nil {
		return fmt.Errorf("copy %s: %w", src, firstErr)
	}
	// Directories last and deepest first: making their entries changed their
	// times, and a read-only mode would have stopped it.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := c.fixDir(dirs[i].dst, dirs[i].st); err != nil {
			return fmt.Errorf("copy %s: %w", src, err)
		}
	}
	return nil
}

// copyDir makes dst a copy of the directory open at fd (rel in the tree),
// its metadata but times and mode, and its entries.
func (c *treeCopier) copyDir(ctx context.Context, fd int, rel, dst string, jobs chan<- copyJob, dirs *[]dirFix) error {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return err
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	if err := c.chown(dst, &st, false); err != nil {
		return err
	}
	if err := copyXattrs(fdXattrs{fd}, dst); err != nil {
		return err
	}
	*dirs = append(*dirs, dirFix{dst, &st})
	dup, err := unix.Dup(fd)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(dup), rel)
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := c.copyEntry(ctx, fd, path.Join(rel, name), name, filepath.Join(dst, name), jobs, dirs); err != nil {
			return err
		}
	}
	return nil
}

// copyEntry copies the entry name of the directory open at dirfd.
func (c *treeCopier) copyEntry(ctx context.Context, dirfd int, rel, name, target string, jobs chan<- copyJob, dirs *[]dirFix) error {
	var lst unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &lst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil // gone since the listing
		}
		return err
	}
	if c.beforeOpen != nil {
		c.beforeOpen(rel)
	}
	switch lst.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		fd, err := unix.Openat(dirfd, name, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return c.changed(dirfd, name, target, err)
		}
		defer unix.Close(fd)
		return c.copyDir(ctx, fd, rel, target, jobs, dirs)
	case unix.S_IFREG:
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return c.changed(dirfd, name, target, err)
		}
		in := os.NewFile(uintptr(fd), rel)
		st := new(syscall.Stat_t)
		if err := syscall.Fstat(fd, st); err != nil {
			in.Close()
			return err
		}
		if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
			in.Close() // swapped for something else since the listing
			return nil
		}
		if st.Nlink > 1 {
			defer in.Close()
			key := [2]uint64{st.Dev, st.Ino}
			if first, ok := c.links[key]; ok {
				return os.Link(first, target)
			}
			c.links[key] = target
			return c.copyFile(in, target, st) // inline, so later links find it
		}
		select {
		case jobs <- copyJob{in, target, st}:
			return nil
		case <-ctx.Done():
			in.Close()
			return ctx.Err()
		}
	case unix.S_IFLNK:
		return c.copyLink(dirfd, name, target)
	case unix.S_IFCHR:
		if lst.Rdev != 0 {
			return nil // a device: skipped
		}
		// An overlayfs whiteout: the copy of a layer must keep it.
		st := statOf(&lst)
		if err := syscall.Mknod(target, st.Mode, 0); err != nil {
			return fmt.Errorf("mknod %s: %w", target, err)
		}
		if err := c.chown(target, st, true); err != nil {
			return err
		}
		if err := syscall.Chmod(target, st.Mode&0o7777); err != nil {
			return err
		}
		if err := copyXattrs(pathXattrs{procPath(dirfd, name)}, target); err != nil {
			return err
		}
		return lutimes(target, st)
	}
	return nil // FIFOs, sockets, block devices: skipped
}

// changed handles an entry that could not be opened as what its lstat
// said: swapped for a symlink, it is copied as one; gone, it is skipped.
func (c *treeCopier) changed(dirfd int, name, target string, err error) error {
	switch {
	case errors.Is(beneath.LinkErr(dirfd, name, err), unix.ELOOP):
		return c.copyLink(dirfd, name, target)
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
		return nil
	}
	return err
}

// copyLink copies the symlink name of the directory open at dirfd as a
// symlink.
func (c *treeCopier) copyLink(dirfd int, name, target string) error {
	var lst unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &lst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if lst.Mode&unix.S_IFMT != unix.S_IFLNK {
		return nil // swapped again: the walk does not chase it
	}
	buf := make([]byte, 4096)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return err
	}
	if err := os.Symlink(string(buf[:n]), target); err != nil {
		return err
	}
	st := statOf(&lst)
	if err := c.chown(target, st, true); err != nil {
		return err
	}
	return lutimes(target, st)
}

// statOf converts a unix.Stat_t to the syscall one the rest uses.
func statOf(u *unix.Stat_t) *syscall.Stat_t {
	return &syscall.Stat_t{
		Dev: u.Dev, Ino: u.Ino, Nlink: u.Nlink, Mode: u.Mode, Uid: u.Uid, Gid: u.Gid,
		Rdev: u.Rdev, Size: u.Size, Blksize: u.Blksize, Blocks: u.Blocks,
		Atim: syscall.Timespec{Sec: u.Atim.Sec, Nsec: u.Atim.Nsec},
		Mtim: syscall.Timespec{Sec: u.Mtim.Sec, Nsec: u.Mtim.Nsec},
		Ctim: syscall.Timespec{Sec: u.Ctim.Sec, Nsec: u.Ctim.Nsec},
	}
}

// procPath names the entry name of the directory open at dirfd through
// /proc, so that path-only calls (the l*xattr family) reach that entry and
// not whatever a path from / would lead to now.
func procPath(dirfd int, name string) string {
	return "/proc/self/fd/" + strconv.Itoa(dirfd) + "/" + name
}

// copyFile copies one opened regular file's contents and metadata.
func (c *treeCopier) copyFile(in *os.File, dst string, st *syscall.Stat_t) error {
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := c.copyData(in, out, st); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", in.Name(), err)
	}
	if err := out.Close(); err != nil {
		return err
	}
	if err := c.chown(dst, st, false); err != nil {
		return err
	}
	if err := syscall.Chmod(dst, st.Mode&0o7777); err != nil {
		return fmt.Errorf("chmod %s: %w", dst, err)
	}
	if err := copyXattrs(fdXattrs{int(in.Fd())}, dst); err != nil {
		return err
	}
	return utimes(dst, st)
}

// fixDir gives a copied directory its source's mode and times.
func (c *treeCopier) fixDir(dst string, st *syscall.Stat_t) error {
	if err := syscall.Chmod(dst, st.Mode&0o7777); err != nil {
		return fmt.Errorf("chmod %s: %w", dst, err)
	}
	return utimes(dst, st)
}

func utimes(dst string, st *syscall.Stat_t) error {
	if err := syscall.UtimesNano(dst, []syscall.Timespec{st.Atim, st.Mtim}); err != nil {
		return fmt.Errorf("utimes %s: %w", dst, err)
	}
	return nil
}

func (c *treeCopier) copyData(in, out *os.File, st *syscall.Stat_t) error {
	if st.Size == 0 {
		return nil
	}
	if c.reflink.Load() {
		inRC, err1 := in.SyscallConn()
		outRC, err2 := out.SyscallConn()
		if err1 == nil && err2 == nil {
			var errno syscall.Errno
			ctlErr := inRC.Control(func(inFD uintptr) {
				_ = outRC.Control(func(outFD uintptr) {
					_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, outFD, ficlone, inFD)
				})
			})
			if ctlErr == nil && errno == 0 {
				return nil
			}
			c.reflink.Store(false) // this filesystem has none: stop asking
		}
	}
	if st.Blocks*512 >= st.Size {
		_, err := io.Copy(out, in) // copy_file_range under the hood
		return err
	}
	return copySparse(in, out, st.Size)
}

// copySparse copies only the data segments of a sparse file, leaving holes.
func copySparse(in, out *os.File, size int64) error {
	var off int64
	for off < size {
		data, err := in.Seek(off, seekData)
		if err != nil {
			if errors.Is(err, syscall.ENXIO) { // only a hole is left
				break
			}
			return err
		}
		hole, err := in.Seek(data, seekHole)
		if err != nil {
			return err
		}
		if _, err := in.Seek(data, io.SeekStart); err != nil { // SEEK_HOLE moved it
			return err
		}
		if _, err := out.Seek(data, io.SeekStart); err != nil {
			return err
		}
		if _, err := io.CopyN(out, in, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return out.Truncate(size)
}

// chown gives p st's owner. Like cp -a, a server that is not root keeps
// what it cannot give away as its own.
func (c *treeCopier) chown(p string, st *syscall.Stat_t, link bool) error {
	uid, gid := int(st.Uid), int(st.Gid)
	if c.as != nil {
		uid, gid = c.as.uid, c.as.gid
	}
	if uid == c.euid && gid == c.egid {
		return nil
	}
	var err error
	if link {
		err = os.Lchown(p, uid, gid)
	} else {
		err = os.Chown(p, uid, gid)
	}
	if err != nil && c.euid != 0 && errors.Is(err, syscall.EPERM) {
		return nil
	}
	return err
}

// xattrSource reads the extended attributes of one copied entry.
type xattrSource interface {
	list(buf []byte) (int, error)
	get(name string, buf []byte) (int, error)
}

// fdXattrs reads them from an open file or directory.
type fdXattrs struct{ fd int }

func (x fdXattrs) list(buf []byte) (int, error) { return unix.Flistxattr(x.fd, buf) }
func (x fdXattrs) get(name string, buf []byte) (int, error) {
	return unix.Fgetxattr(x.fd, name, buf)
}

// pathXattrs reads them from a path, not following a last symlink.
type pathXattrs struct{ path string }

func (x pathXattrs) list(buf []byte) (int, error) { return unix.Llistxattr(x.path, buf) }
func (x pathXattrs) get(name string, buf []byte) (int, error) {
	return unix.Lgetxattr(x.path, name, buf)
}

// copyXattrs copies every extended attribute of src to dst.
func copyXattrs(src xattrSource, dst string) error {
	size, err := src.list(nil)
	if err != nil {
		if errors.Is(err, syscall.ENOTSUP) {
			return nil
		}
		return fmt.Errorf("listxattr for %s: %w", dst, err)
	}
	if size == 0 {
		return nil
	}
	buf := make([]byte, size)
	size, err = src.list(buf)
	if err != nil {
		return fmt.Errorf("listxattr for %s: %w", dst, err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(buf[:size]), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		n, err := src.get(name, nil)
		if err != nil {
			return fmt.Errorf("getxattr %s for %s: %w", name, dst, err)
		}
		val := make([]byte, n)
		if n > 0 {
			if n, err = src.get(name, val); err != nil {
				return fmt.Errorf("getxattr %s for %s: %w", name, dst, err)
			}
			val = val[:n]
		}
		if err := unix.Lsetxattr(dst, name, val, 0); err != nil && !errors.Is(err, syscall.ENOTSUP) {
			return fmt.Errorf("setxattr %s %s: %w", dst, name, err)
		}
	}
	return nil
}

// lutimes sets a symlink's own times (utimensat with AT_SYMLINK_NOFOLLOW).
func lutimes(p string, st *syscall.Stat_t) error {
	const atFDCWD, atSymlinkNofollow = -0x64, 0x100
	path, err := syscall.BytePtrFromString(p)
	if err != nil {
		return err
	}
	ts := [2]syscall.Timespec{st.Atim, st.Mtim}
	dirfd := atFDCWD
	_, _, errno := syscall.Syscall6(syscall.SYS_UTIMENSAT, uintptr(dirfd), uintptr(unsafe.Pointer(path)),
		uintptr(unsafe.Pointer(&ts[0])), atSymlinkNofollow, 0, 0)
	if errno != 0 {
		return fmt.Errorf("utimes %s: %w", p, errno)
	}
	return nil
}
