package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local/beneath"
)

// writeFileIn writes data at rel inside the tree at fsDir, making parents;
// what it makes belongs to own (when not nil). The data goes to a new file
// in the target's directory, renamed over the target: a write never goes
// through an existing link (a hard link to a host file, a symlink), and a
// reader sees the old content or the new, never a part. A directory, FIFO,
// device or socket at the path is refused.
func writeFileIn(fsDir, rel string, data []byte, own *owner) error {
	if rel == "." {
		return fmt.Errorf("local: write %q: the workdir itself is not a file: %w", rel, syscall.EISDIR)
	}
	top, err := beneath.OpenTree(fsDir)
	if err != nil {
		return err
	}
	defer unix.Close(top)
	var bown *beneath.Owner
	if own != nil {
		bown = &beneath.Owner{UID: own.uid, GID: own.gid}
	}
	dirfd, err := beneath.MakeDirs(top, path.Dir(rel), bown)
	if err != nil {
		return beneath.PathErr("write", rel, err)
	}
	defer unix.Close(dirfd)
	name := path.Base(rel)
	mode := uint32(0o644)
	var st unix.Stat_t
	switch err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return fmt.Errorf("local: write %q: %w", rel, syscall.EISDIR)
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFREG:
		mode = st.Mode & 0o777
	case err == nil && st.Mode&unix.S_IFMT != unix.S_IFLNK:
		return fmt.Errorf("local: %q is a %s: %w", rel, kindOf(fileMode(st.Mode)), ErrNotRegular)
	case err != nil && !errors.Is(err, unix.ENOENT):
		return beneath.PathErr("write", rel, err)
	}
	tmp := ".tmp-" + newID("")[:16]
	fd, err := unix.Openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
	if err != nil {
		return beneath.PathErr("write", rel, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	err = func() error {
		defer f.Close()
		if err := f.Chmod(os.FileMode(mode)); err != nil { // the umask's bits
			return err
		}
		if own != nil {
			if err := f.Chown(own.uid, own.gid); err != nil {
				return err
			}
		}
		_, err := f.Write(data)
		return err
	}()
	if err == nil {
		err = unix.Renameat(dirfd, tmp, dirfd, name)
	}
	if err != nil {
		_ = unix.Unlinkat(dirfd, tmp, 0)
		return beneath.PathErr("write", rel, err)
	}
	return nil
}

// openFileIn opens the regular file at rel inside the tree at fsDir and
// returns it with its size, refusing one over limit bytes
// (provider.ErrFileTooLarge) before reading any of it.
func openFileIn(fsDir, rel string, limit int64) (*os.File, int64, error) {
	top, err := beneath.OpenTree(fsDir)
	if err != nil {
		return nil, 0, err
	}
	defer unix.Close(top)
	// O_NONBLOCK: a FIFO a command left at the path must not hang the
	// server; anything but a regular file is refused once open.
	fd, err := beneath.Open(top, rel, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return nil, 0, beneath.PathErr("read", rel, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	fi, err := regular(f, rel)
	if err == nil && fi.Size() > limit {
		err = fmt.Errorf("local: read %q: %d bytes, more than the cap of %d: %w", rel, fi.Size(), limit, provider.ErrFileTooLarge)
	}
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, fi.Size(), nil
}

// readFileIn reads the regular file at rel inside the tree at fsDir, at
// most limit bytes of it: a larger file is provider.ErrFileTooLarge, and
// one that grows while it is read is read up to the size it had.
func readFileIn(fsDir, rel string, limit int64) ([]byte, error) {
	f, size, err := openFileIn(fsDir, rel, limit)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, size))
	if err != nil {
		return nil, fmt.Errorf("local: read %q: %w", rel, err)
	}
	return b, nil
}

// fileMode turns a stat mode into an os.FileMode's type bits.
func fileMode(m uint32) os.FileMode {
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		return os.ModeDir
	case unix.S_IFIFO:
		return os.ModeNamedPipe
	case unix.S_IFCHR:
		return os.ModeDevice | os.ModeCharDevice
	case unix.S_IFBLK:
		return os.ModeDevice
	case unix.S_IFSOCK:
		return os.ModeSocket
	case unix.S_IFLNK:
		return os.ModeSymlink
	}
	return 0
}

// regular stats f, refusing anything but a regular file.
func regular(f *os.File, rel string) (os.FileInfo, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("local: stat %q: %w", rel, err)
	}
	if fi.IsDir() {
		return nil, fmt.Errorf("local: %q is a directory: %w", rel, syscall.EISDIR)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("local: %q is a %s: %w", rel, kindOf(fi.Mode()), ErrNotRegular)
	}
	return fi, nil
}

func kindOf(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&os.ModeNamedPipe != 0:
		return "FIFO"
	case m&os.ModeDevice != 0:
		return "device"
	case m&os.ModeSocket != 0:
		return "socket"
	}
	return "special file"
}

// writeFiles writes a spec's files, in sorted order so failures repeat.
func writeFiles(fsDir, workdir string, files map[string]string, own *owner) error {
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		rel, err := beneath.Rel(workdir, name)
		if err != nil {
			return fmt.Errorf("local: spec file: %w", err)
		}
		if err := writeFileIn(fsDir, rel, []byte(files[name]), own); err != nil {
			return err
		}
	}
	return nil
}

// WriteFile writes data at p (relative to the workdir, or absolute under it),
// making parent directories. A path whose spelling or symlinks leave the tree
// is ErrPathEscape.
func (p *Provider) WriteFile(ctx context.Context, h provider.Handle, name string, data []byte) error {
	if err := ctxErr(ctx, "write file"); err != nil {
		return err
	}
	s, err := p.live(ctx, h, true)
	if err != nil {
		return err
	}
	rel, err := beneath.Rel(s.meta.Workdir, name)
	if err != nil {
		return fmt.Errorf("local: write file: %w", err)
	}
	if int64(len(data)) > p.maxFileBytes {
		return fmt.Errorf("local: write %q: %d bytes, more than the cap of %d: %w", rel, len(data), p.maxFileBytes, provider.ErrFileTooLarge)
	}
	s.gate.RLock()
	defer s.gate.RUnlock()
	if err := p.stillLive(s); err != nil {
		return err
	}
	return writeFileIn(s.fsDir(), rel, data, p.treeOwner(s))
}

// ReadFile reads the file at p (relative to the workdir, or absolute under
// it). A path whose spelling or symlinks leave the tree is ErrPathEscape; a
// missing file is an error wrapping fs.ErrNotExist; a file over
// Options.MaxFileBytes is provider.ErrFileTooLarge, and none of it is read.
func (p *Provider) ReadFile(ctx context.Context, h provider.Handle, name string) ([]byte, error) {
	s, rel, err := p.fileCall(ctx, h, "read file", name)
	if err != nil {
		return nil, err
	}
	s.gate.RLock()
	defer s.gate.RUnlock()
	if err := p.stillLive(s); err != nil {
		return nil, err
	}
	return readFileIn(s.fsDir(), rel, p.maxFileBytes)
}

// OpenFile opens the file at p as ReadFile would read it, for a caller that
// streams it: the reader yields at most the size returned (the file's when
// opened), so a file that a command makes grow is not read past it. The
// caller closes it.
func (p *Provider) OpenFile(ctx context.Context, h provider.Handle, name string) (io.ReadCloser, int64, error) {
	s, rel, err := p.fileCall(ctx, h, "open file", name)
	if err != nil {
		return nil, 0, err
	}
	s.gate.RLock()
	defer s.gate.RUnlock()
	if err := p.stillLive(s); err != nil {
		return nil, 0, err
	}
	f, size, err := openFileIn(s.fsDir(), rel, p.maxFileBytes)
	if err != nil {
		return nil, 0, err
	}
	return limitedFile{io.LimitReader(f, size), f}, size, nil
}

// limitedFile reads a file up to a size and closes it.
type limitedFile struct {
	io.Reader
	io.Closer
}

// fileCall resolves a file call's sandbox and path.
func (p *Provider) fileCall(ctx context.Context, h provider.Handle, what, name string) (*sandbox, string, error) {
	if err := ctxErr(ctx, what); err != nil {
		return nil, "", err
	}
	s, err := p.live(ctx, h, true)
	if err != nil {
		return nil, "", err
	}
	rel, err := beneath.Rel(s.meta.Workdir, name)
	if err != nil {
		return nil, "", fmt.Errorf("local: %s: %w", what, err)
	}
	return s, rel, nil
}

// stillLive re-checks, under the gate, that a Stop did not win the race.
func (p *Provider) stillLive(s *sandbox) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return p.checkLiveLocked(s)
}
