package retention

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// fakeFS answers each path with an error (nil: a directory there;
// errFile: a file).
type fakeFS map[string]error

var errFile = errors.New("a file")

type dirInfo struct {
	name string
	file bool
}

func (d dirInfo) Name() string       { return d.name }
func (d dirInfo) Size() int64        { return 0 }
func (d dirInfo) Mode() fs.FileMode  { return fs.ModeDir | 0o755 }
func (d dirInfo) ModTime() time.Time { return time.Time{} }
func (d dirInfo) IsDir() bool        { return !d.file }
func (d dirInfo) Sys() any           { return &syscall.Stat_t{Dev: 9} }

func (f fakeFS) answer(op, name string) (fs.FileInfo, error) {
	err, ok := f[name]
	if !ok {
		err = syscall.ENOENT
	}
	if err == errFile {
		return dirInfo{name: filepath.Base(name), file: true}, nil
	}
	if err != nil {
		return nil, &fs.PathError{Op: op, Path: name, Err: err}
	}
	return dirInfo{name: filepath.Base(name)}, nil
}

func (f fakeFS) Lstat(name string) (fs.FileInfo, error)   { return f.answer("lstat", name) }
func (f fakeFS) ReadDir(name string) (fs.FileInfo, error) { return f.answer("open", name) }

// Only "no such file" with the parent read is gone; every other error,
// on the directory or on its parent, is not an answer.
func TestLookClassifies(t *testing.T) {
	for name, tc := range map[string]struct {
		fs   fakeFS
		want Observation
	}{
		"present":             {fakeFS{"/r": nil, "/r/ck": nil}, Observation{Status: Present, ParentDev: 9}},
		"gone":                {fakeFS{"/r": nil}, Observation{Status: Gone, ParentDev: 9}},
		"EIO":                 {fakeFS{"/r": nil, "/r/ck": syscall.EIO}, Observation{Status: Unreadable, Reason: ReasonIO}},
		"EACCES":              {fakeFS{"/r": nil, "/r/ck": syscall.EACCES}, Observation{Status: Unreadable, Reason: ReasonPermission}},
		"EPERM":               {fakeFS{"/r": nil, "/r/ck": syscall.EPERM}, Observation{Status: Unreadable, Reason: ReasonPermission}},
		"ESTALE":              {fakeFS{"/r": nil, "/r/ck": syscall.ESTALE}, Observation{Status: Unreadable, Reason: ReasonStale}},
		"ENOTDIR":             {fakeFS{"/r": nil, "/r/ck": syscall.ENOTDIR}, Observation{Status: Unreadable, Reason: ReasonOther}},
		"parent missing":      {fakeFS{}, Observation{Status: Unreadable, Reason: ReasonParentMissing}},
		"parent not a dir":    {fakeFS{"/r": syscall.ENOTDIR}, Observation{Status: Unreadable, Reason: ReasonParentMissing}},
		"parent a file":       {fakeFS{"/r": errFile}, Observation{Status: Unreadable, Reason: ReasonParentMissing}},
		"parent EACCES":       {fakeFS{"/r": syscall.EACCES}, Observation{Status: Unreadable, Reason: ReasonParentUnreadable}},
		"parent EIO":          {fakeFS{"/r": syscall.EIO}, Observation{Status: Unreadable, Reason: ReasonParentUnreadable}},
		"parent ESTALE":       {fakeFS{"/r": syscall.ESTALE}, Observation{Status: Unreadable, Reason: ReasonParentUnreadable}},
		"present, parent bad": {fakeFS{"/r": syscall.EIO, "/r/ck": nil}, Observation{Status: Present}},
	} {
		t.Run(name, func(t *testing.T) {
			got := Look(tc.fs, "/r/ck/")
			if diff := cmp.Diff(tc.want, got, cmpopts.IgnoreFields(Observation{}, "Detail")); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// The same on real directories: one there, one deleted, one under a
// mount point that is not there, one under a file.
func TestLookRealDirectories(t *testing.T) {
	root := t.TempDir()
	there := filepath.Join(root, "ck1")
	if err := os.Mkdir(there, 0o755); err != nil {
		t.Fatal(err)
	}
	deleted := filepath.Join(root, "ck2")
	if err := os.Mkdir(deleted, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(deleted); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(root, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(root, &st); err != nil {
		t.Fatal(err)
	}
	dev := uint64(st.Dev) //nolint:unconvert
	for dir, want := range map[string]Observation{
		there:   {Status: Present, ParentDev: dev},
		deleted: {Status: Gone, ParentDev: dev},
		filepath.Join(root, "mnt", "ckpts", "ck3"): {Status: Unreadable, Reason: ReasonParentMissing},
		filepath.Join(file, "ck4"):                 {Status: Unreadable, Reason: ReasonOther},
	} {
		got := Look(OS{}, dir)
		if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(Observation{}, "Detail")); diff != "" {
			t.Errorf("%s (-want +got):\n%s", dir, diff)
		}
	}
}

// An unreadable parent, for real, where permissions hold (not as root).
func TestLookUnreadableParent(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root reads every directory: TestLookClassifies covers an unreadable parent with a fake")
	}
	root := t.TempDir()
	parent := filepath.Join(root, "ckpts")
	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(parent, 0o100); err != nil { // searchable, not readable
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(parent, 0o755) })
	got := Look(OS{}, filepath.Join(parent, "ck1"))
	if diff := cmp.Diff(Observation{Status: Unreadable, Reason: ReasonParentUnreadable}, got, cmpopts.IgnoreFields(Observation{}, "Detail")); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
