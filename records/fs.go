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
