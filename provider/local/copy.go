package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"
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
// whiteouts and opaque directories survive), symlinks, hard links, device
// nodes and holes in sparse files. Regular files are copied by `workers`
// goroutines, each file as a reflink where the filesystem has them and by
// copy_file_range otherwise. A non-nil as owns every copy instead.
func copyTree(ctx context.Context, src, dst string, workers int, as *owner) error {
	c := &treeCopier{links: map[[2]uint64]string{}, euid: os.Geteuid(), egid: os.Getegid(), as: as}
	c.reflink.Store(true)
	return c.run(ctx, src, dst, workers)
}

type treeCopier struct {
	reflink    atomic.Bool
	links      map[[2]uint64]string // (dev, inode) of a hard-linked file -> its copy; walker only
	euid, egid int
	as         *owner
}

type copyJob struct {
	src, dst string
	st       *syscall.Stat_t
}

type dirFix struct {
	src, dst string
	st       *syscall.Stat_t
}

func (c *treeCopier) run(ctx context.Context, src, dst string, workers int) error {
	rootInfo, err := os.Lstat(src)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if !rootInfo.IsDir() {
		return fmt.Errorf("copy %s: not a directory", src)
	}
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
				if ctx.Err() != nil {
					continue
				}
				if err := c.copyFile(j.src, j.dst, j.st); err != nil {
					fail(err)
				}
			}
		})
	}

	var dirs []dirFix
	walkErr := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("copy %s: no stat", p)
		}
		switch mode := info.Mode(); {
		case mode.IsDir():
			if err := os.Mkdir(target, 0o700); err != nil {
				return err
			}
			dirs = append(dirs, dirFix{p, target, st})
		case mode.IsRegular():
			if st.Nlink > 1 {
				key := [2]uint64{st.Dev, st.Ino}
				if first, ok := c.links[key]; ok {
					return os.Link(first, target)
				}
				c.links[key] = target
				return c.copyFile(p, target, st) // inline, so later links find it
			}
			select {
			case jobs <- copyJob{p, target, st}:
			case <-ctx.Done():
				return ctx.Err()
			}
		case mode&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
			if err := c.chown(target, st, true); err != nil {
				return err
			}
			return lutimes(target, st)
		default: // devices (overlayfs whiteouts among them), fifos, sockets
			if err := syscall.Mknod(target, st.Mode, int(st.Rdev)); err != nil {
				return fmt.Errorf("mknod %s: %w", target, err)
			}
			return c.fixMeta(p, target, st)
		}
		return nil
	})
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
		if err := c.fixMeta(dirs[i].src, dirs[i].dst, dirs[i].st); err != nil {
			return fmt.Errorf("copy %s: %w", src, err)
		}
	}
	return nil
}

// copyFile copies one regular file's contents and metadata.
func (c *treeCopier) copyFile(src, dst string, st *syscall.Stat_t) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := c.copyData(in, out, st); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		return err
	}
	return c.fixMeta(src, dst, st)
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

// fixMeta gives dst src's owner, mode, extended attributes and times.
func (c *treeCopier) fixMeta(src, dst string, st *syscall.Stat_t) error {
	if err := c.chown(dst, st, false); err != nil {
		return err
	}
	if err := syscall.Chmod(dst, st.Mode&0o7777); err != nil {
		return fmt.Errorf("chmod %s: %w", dst, err)
	}
	if err := copyXattrs(src, dst); err != nil {
		return err
	}
	ts := []syscall.Timespec{st.Atim, st.Mtim}
	if err := syscall.UtimesNano(dst, ts); err != nil {
		return fmt.Errorf("utimes %s: %w", dst, err)
	}
	return nil
}

// copyXattrs copies every extended attribute of src (not a symlink) to dst.
func copyXattrs(src, dst string) error {
	size, err := syscall.Listxattr(src, nil)
	if err != nil {
		if errors.Is(err, syscall.ENOTSUP) {
			return nil
		}
		return fmt.Errorf("listxattr %s: %w", src, err)
	}
	if size == 0 {
		return nil
	}
	buf := make([]byte, size)
	size, err = syscall.Listxattr(src, buf)
	if err != nil {
		return fmt.Errorf("listxattr %s: %w", src, err)
	}
	start := 0
	for i := 0; i < size; i++ {
		if buf[i] != 0 {
			continue
		}
		name := string(buf[start:i])
		start = i + 1
		if name == "" {
			continue
		}
		n, err := syscall.Getxattr(src, name, nil)
		if err != nil {
			return fmt.Errorf("getxattr %s %s: %w", src, name, err)
		}
		val := make([]byte, n)
		if n > 0 {
			if n, err = syscall.Getxattr(src, name, val); err != nil {
				return fmt.Errorf("getxattr %s %s: %w", src, name, err)
			}
			val = val[:n]
		}
		if err := syscall.Setxattr(dst, name, val, 0); err != nil && !errors.Is(err, syscall.ENOTSUP) {
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
