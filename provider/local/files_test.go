package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxowner/owner/provider"
)

func TestFilesRoundTripAndWorkdirPaths(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		p := newProvider(t, m, Options{})
		h := start(t, p, provider.Spec{Workdir: "/wk-test/space"})
		writeFile(t, p, h, "a/b/c.txt", "deep")
		if got := readFile(t, p, h, "/wk-test/space/a/b/c.txt"); got != "deep" {
			t.Errorf("absolute read = %q", got)
		}
		writeFile(t, p, h, "/wk-test/space/top.txt", "top")
		if got := mustRun(t, p, h, "cat top.txt a/b/c.txt"); got != "topdeep" {
			t.Errorf("command sees %q", got)
		}
		// A command's file is readable; a symlink, even one that stays in
		// the tree, is never followed.
		mustRun(t, p, h, "printf made > made.txt && ln -s a/b inner")
		if got := readFile(t, p, h, "made.txt"); got != "made" {
			t.Errorf("read a command's file: %q", got)
		}
		if _, err := p.ReadFile(context.Background(), h, "inner/c.txt"); !errors.Is(err, provider.ErrPathEscape) {
			t.Errorf("read through an inner symlink: %v", err)
		}
		if _, err := p.ReadFile(context.Background(), h, "missing"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("missing file: %v", err)
		}
	})
}

func TestPathEscapesAreRefused(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		outside := t.TempDir()
		if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o644); err != nil {
			t.Fatal(err)
		}
		p := newProvider(t, m, Options{})
		h := start(t, p, provider.Spec{})
		// Symlinks a command (an agent) could plant: absolute, relative
		// climbing out, and a chain.
		tree := fsDir(p, h)
		for name, target := range map[string]string{"abs": outside, "up": "../../../../../../../..", "chain": "up"} {
			if err := os.Symlink(target, filepath.Join(tree, name)); err != nil {
				t.Fatal(err)
			}
		}
		ctx := context.Background()
		for _, name := range []string{
			"../x", "a/../../x", "/etc/passwd", DefaultWorkdir + "/../etc/passwd", DefaultWorkdir + "x/y", "",
			"abs/secret", "up" + outside + "/secret", "chain" + outside + "/secret",
		} {
			if _, err := p.ReadFile(ctx, h, name); !errors.Is(err, provider.ErrPathEscape) {
				t.Errorf("ReadFile(%q): err = %v, want ErrPathEscape", name, err)
			}
			if name == "" {
				name = "/"
			}
			if err := p.WriteFile(ctx, h, name+"-w", []byte("x")); !errors.Is(err, provider.ErrPathEscape) {
				t.Errorf("WriteFile(%q): err = %v, want ErrPathEscape", name+"-w", err)
			}
		}
		if err := p.WriteFile(ctx, h, "abs/new", []byte("x")); !errors.Is(err, provider.ErrPathEscape) {
			t.Errorf("write through an escaping symlink: %v", err)
		}
		if _, err := os.Stat(filepath.Join(outside, "new")); err == nil {
			t.Errorf("a write escaped the sandbox")
		}
		if _, err := p.Exec(ctx, h, provider.ExecRequest{Command: "true", Cwd: "abs"}); !errors.Is(err, provider.ErrPathEscape) {
			t.Errorf("exec cwd through an escaping symlink: %v", err)
		}
		// Spec files are checked too, and a refused start leaves nothing.
		if _, err := p.Start(ctx, provider.Spec{Files: map[string]string{"../evil": "x"}}); !errors.Is(err, provider.ErrPathEscape) {
			t.Errorf("Start with an escaping file: %v", err)
		}
	})
}

func TestFileCallsRefuseSpecialFiles(t *testing.T) {
	t.Parallel()
	p := newProvider(t, mode{"none-copy", IsolationNone, OverlayOff}, Options{})
	h := start(t, p, provider.Spec{})
	if err := syscall.Mkfifo(filepath.Join(fsDir(p, h), "fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	mustRun(t, p, h, "mkdir d")
	ctx := context.Background()
	// A FIFO must neither hang the server nor be read.
	if _, err := p.ReadFile(ctx, h, "fifo"); !errors.Is(err, ErrNotRegular) {
		t.Errorf("read a FIFO: %v", err)
	}
	if err := p.WriteFile(ctx, h, "fifo", []byte("x")); err == nil {
		t.Errorf("write a FIFO with no reader succeeded")
	}
	if _, err := p.ReadFile(ctx, h, "d"); !errors.Is(err, syscall.EISDIR) {
		t.Errorf("read a directory: %v", err)
	}
	if err := p.WriteFile(ctx, h, ".", []byte("x")); err == nil {
		t.Errorf("write the workdir itself succeeded")
	}
}

// With isolation none, a write used to go through a hard link the agent
// made to a host file (/etc/hostname), and through symlinks.
func TestWritesNeverGoThroughALink(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		p := newProvider(t, m, Options{})
		h := start(t, p, provider.Spec{Files: map[string]string{"real": "real\n"}})
		host := filepath.Join(p.Root(), "host-file") // same filesystem as the tree
		if s, _ := p.loaded(h); s.hasDisk {
			// A hard link cannot leave the sandbox's disk: the file it
			// must not change is on the disk, beside the tree.
			host = filepath.Join(s.diskDir(), "host-file")
		}
		if err := os.WriteFile(host, []byte("host\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		tree := fsDir(p, h)
		if err := os.Link(host, filepath.Join(tree, "hard")); err != nil {
			if m.overlay == OverlayOn {
				t.Skipf("SKIP: no hard link across the overlay: %v", err)
			}
			t.Fatal(err)
		}
		if err := os.Symlink("real", filepath.Join(tree, "soft")); err != nil {
			t.Fatal(err)
		}
		writeFile(t, p, h, "hard", "mine\n")
		writeFile(t, p, h, "soft", "replaced\n")
		if b, _ := os.ReadFile(host); string(b) != "host\n" {
			t.Errorf("the host file reads %q after a write to its hard link", b)
		}
		if got := readFile(t, p, h, "hard"); got != "mine\n" {
			t.Errorf("hard = %q", got)
		}
		if got := readFile(t, p, h, "real"); got != "real\n" {
			t.Errorf("a write to a symlink changed its target: %q", got)
		}
		if fi, err := os.Lstat(filepath.Join(tree, "soft")); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("soft is %v (%v), want the regular file written in its place", fi, err)
		}
		// Nothing of the write is left behind.
		if got := mustRun(t, p, h, "ls -A"); got != "hard\nreal\nsoft\n" {
			t.Errorf("the tree holds %q", got)
		}
	})
}

// Client mistakes carry their errno, which the sandbox API answers with a
// code of its own.
func TestFileMistakesKeepTheirKind(t *testing.T) {
	t.Parallel()
	p := newProvider(t, mode{"none-copy", IsolationNone, OverlayOff}, Options{})
	h := start(t, p, provider.Spec{Files: map[string]string{"f": "x", "d/g": "y"}})
	ctx := context.Background()
	long := strings.Repeat("n", 300)
	for _, c := range []struct {
		name string
		read bool
		want error
	}{
		{"d", true, syscall.EISDIR},
		{"d", false, syscall.EISDIR},
		{"f/x", true, syscall.ENOTDIR},
		{"f/x", false, syscall.ENOTDIR},
		{long, true, syscall.ENAMETOOLONG},
		{long, false, syscall.ENAMETOOLONG},
		{"missing", true, fs.ErrNotExist},
	} {
		var err error
		if c.read {
			_, err = p.ReadFile(ctx, h, c.name)
		} else {
			err = p.WriteFile(ctx, h, c.name, []byte("z"))
		}
		if !errors.Is(err, c.want) {
			t.Errorf("read=%v %.20q: %v, want %v", c.read, c.name, err, c.want)
		}
	}
}

// A file over Options.MaxFileBytes is refused before any of it is read, so
// a sandbox cannot make the server hold a file of any size; OpenFile hands
// out a file as a stream of the size it had when opened.
func TestFilesAreCappedAndStreamed(t *testing.T) {
	t.Parallel()
	const limit = 1 << 16
	p := newProvider(t, mode{"none-copy", IsolationNone, OverlayOff}, Options{MaxFileBytes: limit})
	h := start(t, p, provider.Spec{})
	ctx := context.Background()
	mustRun(t, p, h, fmt.Sprintf("head -c %d /dev/zero > fits; head -c %d /dev/zero > over", limit, limit+1))
	if got := readFile(t, p, h, "fits"); len(got) != limit {
		t.Errorf("a file of exactly the cap: %d bytes read", len(got))
	}
	if _, err := p.ReadFile(ctx, h, "over"); !errors.Is(err, provider.ErrFileTooLarge) {
		t.Errorf("ReadFile of a file over the cap: %v, want ErrFileTooLarge", err)
	}
	if _, _, err := p.OpenFile(ctx, h, "over"); !errors.Is(err, provider.ErrFileTooLarge) {
		t.Errorf("OpenFile of a file over the cap: %v, want ErrFileTooLarge", err)
	}
	if err := p.WriteFile(ctx, h, "w", make([]byte, limit+1)); !errors.Is(err, provider.ErrFileTooLarge) {
		t.Errorf("WriteFile over the cap: %v, want ErrFileTooLarge", err)
	}
	writeFile(t, p, h, "w", string(make([]byte, limit)))

	rc, size, err := p.OpenFile(ctx, h, "fits")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	// The file grows after it was opened: the stream stops at its size.
	mustRun(t, p, h, "echo more >> fits")
	b, err := io.ReadAll(rc)
	if err != nil || size != limit || len(b) != limit {
		t.Errorf("OpenFile: size %d, %d bytes read (%v), want %d of each", size, len(b), err, limit)
	}
	for _, name := range []string{"", "../x", "missing"} {
		if _, _, err := p.OpenFile(ctx, h, name); err == nil {
			t.Errorf("OpenFile(%q) succeeded", name)
		}
	}
	mustRun(t, p, h, "mkfifo fifo; mkdir dir")
	if _, _, err := p.OpenFile(ctx, h, "fifo"); !errors.Is(err, ErrNotRegular) {
		t.Errorf("OpenFile of a FIFO: %v", err)
	}
	if _, _, err := p.OpenFile(ctx, h, "dir"); !errors.Is(err, syscall.EISDIR) {
		t.Errorf("OpenFile of a directory: %v", err)
	}
}
