package retention

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// FS is what a lookup needs of the file system checkpoint directories are
// on. The operating system's is OS; the simulation's is in memory.
type FS interface {
	// Lstat describes name without following a last symlink.
	Lstat(name string) (fs.FileInfo, error)
	// ReadDir opens the directory name, reads from it, and describes it:
	// it succeeds only for a directory that can be read.
	ReadDir(name string) (fs.FileInfo, error)
}

// OS is the operating system's file system.
type OS struct{}

var _ FS = OS{}

// Lstat implements FS.
func (OS) Lstat(name string) (fs.FileInfo, error) { return os.Lstat(name) }

// ReadDir implements FS.
func (OS) ReadDir(name string) (fs.FileInfo, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Readdirnames(1); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return f.Stat()
}

// Look looks dir up on fsys. Only "no such file" for dir itself, with its
// parent read, is Gone: an error on the parent (missing: an unmounted
// filesystem's mount point gone too; unreadable) or any other error on dir
// is Unreadable.
func Look(fsys FS, dir string) Observation {
	dir = filepath.Clean(dir)
	parent := filepath.Dir(dir)
	_, err := fsys.Lstat(dir)
	if err != nil && !errors.Is(err, syscall.ENOENT) {
		return Observation{Status: Unreadable, Reason: reasonOf(err), Detail: err.Error()}
	}
	pi, perr := fsys.ReadDir(parent)
	if perr != nil {
		if err == nil {
			// The directory is there; its parent's device is unknown.
			return Observation{Status: Present}
		}
		reason := ReasonParentUnreadable
		if errors.Is(perr, syscall.ENOENT) || errors.Is(perr, syscall.ENOTDIR) {
			reason = ReasonParentMissing
		}
		return Observation{Status: Unreadable, Reason: reason, Detail: fmt.Sprintf("%v (looking up %s: %v)", perr, dir, err)}
	}
	if !pi.IsDir() {
		return Observation{Status: Unreadable, Reason: ReasonParentMissing, Detail: parent + " is not a directory"}
	}
	if err == nil {
		return Observation{Status: Present, ParentDev: devOf(pi)}
	}
	return Observation{Status: Gone, Detail: err.Error(), ParentDev: devOf(pi)}
}

// reasonOf names an error that is not "no such file".
func reasonOf(err error) string {
	switch {
	case errors.Is(err, syscall.EIO):
		return ReasonIO
	case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
		return ReasonPermission
	case errors.Is(err, syscall.ESTALE):
		return ReasonStale
	}
	return ReasonOther
}

// devOf is the device of a file (0 when the file system does not say).
func devOf(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Dev) //nolint:unconvert // Dev is not uint64 on every platform
	}
	return 0
}
