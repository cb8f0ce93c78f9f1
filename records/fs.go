package records

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// FS is the file system checkpoint directories live on: the operating
// system's (OS), or a MemFS for the simulation, where a controller's
// directory must outlive the owners that write into it without touching the
// disk.
type FS interface {
	MkdirAll(dir string) error
	// CreateTemp creates a new file in dir whose name starts with prefix.
	CreateTemp(dir, prefix string) (File, error)
	Rename(from, to string) error
	// Link makes to another name of from; an existing to is fs.ErrExist
	// and is left alone.
	Link(from, to string) error
	// Remove deletes a file; an absent one is fs.ErrNotExist.
	Remove(name string) error
	Open(name string) (io.ReadCloser, error)
	SyncDir(dir string) error
}

// File is a file being written.
type File interface {
	io.Writer
	Name() string
	Sync() error
	Close() error
}

// OS is the operating system's file system.
type OS struct{}

var _ FS = OS{}

// MkdirAll implements FS.
func (OS) MkdirAll(dir string) error { return os.MkdirAll(dir, 0o755) }

// CreateTemp implements FS.
func (OS) CreateTemp(dir, prefix string) (File, error) { return os.CreateTemp(dir, prefix+"*") }

// Rename implements FS.
func (OS) Rename(from, to string) error { return os.Rename(from, to) }

// Link implements FS.
func (OS) Link(from, to string) error { return os.Link(from, to) }

// Remove implements FS.
func (OS) Remove(name string) error { return os.Remove(name) }

// Open implements FS.
func (OS) Open(name string) (io.ReadCloser, error) { return os.Open(name) }

// SyncDir implements FS.
func (OS) SyncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// MemFS is an in-memory FS: what a file holds once closed, under cleaned
// slash paths. Temporary names are numbered, so a run that writes the same
// files names them the same. It is safe for concurrent use.
type MemFS struct {
	mu    sync.Mutex
	files map[string][]byte
	dirs  map[string]bool
	temp  int
}

var _ FS = (*MemFS)(nil)

// NewMemFS returns an empty MemFS.
func NewMemFS() *MemFS { return &MemFS{files: map[string][]byte{}, dirs: map[string]bool{"/": true}} }

func memErr(op, name string, err error) error { return &fs.PathError{Op: op, Path: name, Err: err} }

// MkdirAll implements FS.
func (m *MemFS) MkdirAll(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for d := path.Clean(dir); ; d = path.Dir(d) {
		if _, ok := m.files[d]; ok {
			return memErr("mkdir", d, fs.ErrExist)
		}
		m.dirs[d] = true
		if d == "/" || d == "." {
			return nil
		}
	}
}

// CreateTemp implements FS.
func (m *MemFS) CreateTemp(dir, prefix string) (File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	dir = path.Clean(dir)
	if !m.dirs[dir] {
		return nil, memErr("create", dir, fs.ErrNotExist)
	}
	m.temp++
	name := path.Join(dir, fmt.Sprintf("%s%d", prefix, m.temp))
	m.files[name] = nil
	return &memFile{fs: m, name: name}, nil
}

// Rename implements FS.
func (m *MemFS) Rename(from, to string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	from, to = path.Clean(from), path.Clean(to)
	b, ok := m.files[from]
	if !ok {
		return memErr("rename", from, fs.ErrNotExist)
	}
	delete(m.files, from)
	m.files[to] = b
	return nil
}

// Link implements FS.
func (m *MemFS) Link(from, to string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	from, to = path.Clean(from), path.Clean(to)
	b, ok := m.files[from]
	if !ok {
		return memErr("link", from, fs.ErrNotExist)
	}
	if _, exists := m.files[to]; exists {
		return memErr("link", to, fs.ErrExist)
	}
	m.files[to] = b
	return nil
}

// Remove implements FS.
func (m *MemFS) Remove(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	name = path.Clean(name)
	if _, ok := m.files[name]; !ok {
		return memErr("remove", name, fs.ErrNotExist)
	}
	delete(m.files, name)
	return nil
}

// Open implements FS.
func (m *MemFS) Open(name string) (io.ReadCloser, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.files[path.Clean(name)]
	if !ok {
		return nil, memErr("open", name, fs.ErrNotExist)
	}
	return io.NopCloser(strings.NewReader(string(b))), nil
}

// SyncDir implements FS.
func (m *MemFS) SyncDir(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.dirs[path.Clean(dir)] {
		return memErr("sync", dir, fs.ErrNotExist)
	}
	return nil
}

// Lstat describes name: a directory, or a file of its size. An absent one
// is fs.ErrNotExist (syscall.ENOENT, as the operating system says it).
func (m *MemFS) Lstat(name string) (fs.FileInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	name = path.Clean(name)
	if m.dirs[name] {
		return memInfo{name: path.Base(name), dir: true}, nil
	}
	if b, ok := m.files[name]; ok {
		return memInfo{name: path.Base(name), size: int64(len(b))}, nil
	}
	return nil, memErr("lstat", name, syscall.ENOENT)
}

// ReadDir describes the directory name, which must be one: the lookup a
// check of a checkpoint directory's parent makes.
func (m *MemFS) ReadDir(name string) (fs.FileInfo, error) {
	fi, err := m.Lstat(name)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, memErr("open", name, syscall.ENOTDIR)
	}
	return fi, nil
}

// RemoveAll deletes dir and everything under it, as a controller deleting
// a checkpoint directory does.
func (m *MemFS) RemoveAll(dir string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	dir = path.Clean(dir)
	under := func(p string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
	for p := range m.files {
		if under(p) {
			delete(m.files, p)
		}
	}
	for p := range m.dirs {
		if under(p) && p != "/" {
			delete(m.dirs, p)
		}
	}
}

type memInfo struct {
	name string
	size int64
	dir  bool
}

func (i memInfo) Name() string { return i.name }
func (i memInfo) Size() int64  { return i.size }
func (i memInfo) Mode() fs.FileMode {
	if i.dir {
		return fs.ModeDir | 0o755
	}
	return 0o644
}
func (i memInfo) ModTime() time.Time { return time.Time{} }
func (i memInfo) IsDir() bool        { return i.dir }
func (i memInfo) Sys() any           { return nil }

// Files lists every file's path, sorted: what a test or the simulation
// inspects.
func (m *MemFS) Files() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.files))
}

// WriteFile replaces a file's bytes (creating its directory): how a test
// corrupts what a writer left.
func (m *MemFS) WriteFile(name string, b []byte) error {
	if err := m.MkdirAll(path.Dir(name)); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.files[path.Clean(name)] = slices.Clone(b)
	return nil
}

type memFile struct {
	fs     *MemFS
	name   string
	buf    []byte
	closed bool
}

func (f *memFile) Name() string { return f.name }

func (f *memFile) Write(p []byte) (int, error) {
	if f.closed {
		return 0, fs.ErrClosed
	}
	f.buf = append(f.buf, p...)
	return len(p), nil
}

func (f *memFile) Sync() error {
	if f.closed {
		return fs.ErrClosed
	}
	return nil
}

func (f *memFile) Close() error {
	if f.closed {
		return fs.ErrClosed
	}
	f.closed = true
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if _, ok := f.fs.files[f.name]; !ok {
		return errors.New("records: memfs: file removed while open")
	}
	f.fs.files[f.name] = f.buf
	return nil
}
