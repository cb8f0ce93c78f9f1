package local

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local/localtest"
	"github.com/sandboxowner/owner/provider/local/sinit"
)

// A separate init binary that does not speak the server's protocol (an
// older build, another program, nothing at all) is refused by New with
// ErrBadOptions naming what it answered and what was expected; the server
// never falls back to its own binary, and keeps no copy of the refused one.
func TestAnInitBinaryOfAnotherProtocolIsRefused(t *testing.T) {
	dir := t.TempDir()
	script := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	older := "sandboxowner-init protocol 0 0123456789abcdef"
	for _, c := range []struct {
		name, bin string
		want      []string // in the error
	}{
		{"older build", script("older", "echo '"+older+"'"), []string{older, sinit.Identity(), "go build ./cmd/sandbox-init"}},
		{"another program", script("other", `echo "$0 $*"`), []string{`sandbox-init identity"`, sinit.Identity()}},
		{"a failing program", script("failing", "echo broken >&2; exit 3"), []string{"not a sandbox init", "exit status 3", "broken"}},
		{"no file", filepath.Join(dir, "missing"), []string{"missing"}},
		{"a directory", dir, []string{"not a regular file"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			p, err := New(Options{Root: root, Isolation: IsolationContainer, Overlay: OverlayOff, InitBinary: c.bin, Logger: testLogger(t)})
			if err == nil {
				p.Close()
				t.Fatalf("New with init binary %s started", c.bin)
			}
			if !errors.Is(err, ErrBadOptions) {
				t.Errorf("New: %v, want ErrBadOptions", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("New: %v, want it to say %q", err, w)
				}
			}
			if left, _ := filepath.Glob(filepath.Join(root, "init-*")); len(left) != 0 {
				t.Errorf("the refused binary's copies stay: %v", left)
			}
		})
	}
}

// Each sandbox's init runs the binary its provider was given: the separate
// init (cmd/sandbox-init) when Options.InitBinary names it, else the
// server's own binary, as `go run ./cmd/server` needs no build step, in
// both isolations.
func TestTheInitRunsTheBinaryItWasGiven(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	separate := localtest.InitBinary(t)
	for _, c := range []struct {
		m    mode
		bin  string // Options.InitBinary
		want string // the binary the init runs a copy (or link) of
	}{
		{mode{"none-own", IsolationNone, OverlayOff}, ownInitBinary, self},
		{mode{"none-separate", IsolationNone, OverlayOff}, separate, separate},
		{mode{"container-own", IsolationContainer, OverlayOff}, ownInitBinary, self},
		{mode{"container-separate", IsolationContainer, OverlayOff}, separate, separate},
	} {
		t.Run(c.m.name, func(t *testing.T) {
			t.Parallel()
			p := newProvider(t, c.m, Options{InitBinary: c.bin})
			h := start(t, p, provider.Spec{})
			if got := mustRun(t, p, h, "echo ok"); got != "ok\n" {
				t.Fatalf("exec: %q", got)
			}
			pid := initPid(p, h)
			exe, err := os.Stat("/proc/" + strconv.Itoa(pid) + "/exe")
			if err != nil {
				t.Fatal(err)
			}
			want, err := os.Stat(c.want)
			if err != nil {
				t.Fatal(err)
			}
			// A link of it, or a copy: the two binaries differ in size
			// many times over.
			if !os.SameFile(exe, want) && exe.Size() != want.Size() {
				t.Errorf("the init runs a binary of %d bytes, want %s (%d bytes)", exe.Size(), c.want, want.Size())
			}
		})
	}
}

// The separate init a provider checked is the one its sandboxes run:
// rewriting the operator's file in place afterwards (as cp does over an
// existing file), or replacing the file its path's symlink names, changes
// nothing the provider runs. A hard link to the file would share its
// inode, and one to the symlink (linkat does not follow it) would follow
// the path at each start, both running an init that was never checked.
func TestTheCheckedInitBinaryIsTheOneRun(t *testing.T) {
	built := localtest.InitBinary(t)
	impostor := []byte("#!/bin/sh\necho impostor >&2\nexit 7\n")
	for _, c := range []struct {
		name    string
		symlink bool
	}{{"rewritten in place", false}, {"its symlink's file replaced", true}} {
		for _, m := range []mode{{"none", IsolationNone, OverlayOff}, {"container", IsolationContainer, OverlayOff}} {
			t.Run(c.name+"/"+m.name, func(t *testing.T) {
				dir := t.TempDir()
				file := filepath.Join(dir, "sandbox-init")
				if err := copyFile(built, file); err != nil {
					t.Fatal(err)
				}
				given := file
				if c.symlink {
					given = filepath.Join(dir, "link")
					if err := os.Symlink(file, given); err != nil {
						t.Fatal(err)
					}
				}
				p := newProvider(t, m, Options{InitBinary: given})
				if c.symlink {
					next := filepath.Join(dir, "next")
					if err := os.WriteFile(next, impostor, 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.Rename(next, file); err != nil {
						t.Fatal(err)
					}
				} else if err := os.WriteFile(file, impostor, 0o755); err != nil {
					t.Fatal(err)
				}
				h := start(t, p, provider.Spec{})
				if got := mustRun(t, p, h, "echo ok"); got != "ok\n" {
					t.Fatalf("exec: %q", got)
				}
			})
		}
	}
}

// The placed init is executable by every uid (a sandbox's runs it) under
// a server's umask that would keep a new file its owner's alone (systemd's
// UMask=0077), as its directory is. Not parallel: the umask is the
// process's.
func TestThePlacedInitIsExecutableByEveryUid(t *testing.T) {
	src := filepath.Join(t.TempDir(), "init")
	if err := os.WriteFile(src, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := &Provider{root: t.TempDir()}
	old := syscall.Umask(0o077)
	bin, err := p.placeBinary(src, false)
	syscall.Umask(old)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{bin, filepath.Dir(bin)} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != 0o755 {
			t.Errorf("%s: mode %v, want -rwxr-xr-x", path, got)
		}
	}
}

// A placed init can be run at once however many processes the server is
// forking meanwhile: a child forked while the copy was open for writing
// would hold it open until its own exec, and running the copy then fails
// with ETXTBSY (text file busy). Before copyFile held the fork lock, a
// provider's New failed so in its check of the copy when another test's
// sandboxes were starting; here forks run back to back beside 50 copies,
// each run as soon as it is placed.
func TestAPlacedInitRunsWhileTheServerForks(t *testing.T) {
	built := localtest.InitBinary(t)
	p := &Provider{root: t.TempDir()}
	stop := make(chan struct{})
	forked := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				forked <- nil
				return
			default:
			}
			if err := exec.Command("/bin/true").Run(); err != nil {
				forked <- err
				return
			}
		}
	}()
	defer func() {
		close(stop)
		if err := <-forked; err != nil {
			t.Error(err)
		}
	}()
	for i := 0; i < 50; i++ {
		bin, err := p.placeBinary(built, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkInitBinary(bin); err != nil {
			t.Fatalf("copy %d: %v", i, err)
		}
	}
}
