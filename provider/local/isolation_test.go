package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local/uidrange"
)

func TestImages(t *testing.T) {
	forModes(t, func(t *testing.T, m mode) {
		tmpl := t.TempDir()
		if err := os.MkdirAll(filepath.Join(tmpl, "src"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tmpl, "src", "main.py"), []byte("print(1)\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		p := newProvider(t, m, Options{Templates: map[string]string{"repo": tmpl, "notes": ""}})
		ctx := context.Background()

		h := start(t, p, provider.Spec{Image: "repo", Files: map[string]string{"extra.txt": "e", "src/cfg": "c"}})
		if got := mustRun(t, p, h, "cat src/main.py extra.txt src/cfg; test -x src/main.py && echo exec"); got != "print(1)\necexec\n" {
			t.Errorf("template sandbox sees %q", got)
		}
		// Writes in the sandbox never reach the template.
		mustRun(t, p, h, "echo changed > src/main.py && rm -r src && echo x > new")
		if b, err := os.ReadFile(filepath.Join(tmpl, "src", "main.py")); err != nil || string(b) != "print(1)\n" {
			t.Errorf("the template changed: %q, %v", b, err)
		}
		if _, err := os.Stat(filepath.Join(tmpl, "new")); err == nil {
			t.Errorf("a sandbox wrote into its template")
		}
		// An absolute directory is an image too; an empty template is empty.
		abs := start(t, p, provider.Spec{Image: tmpl})
		if got := readFile(t, p, abs, "src/main.py"); got != "print(1)\n" {
			t.Errorf("absolute image: %q", got)
		}
		empty := start(t, p, provider.Spec{Image: "notes"})
		if got := mustRun(t, p, empty, "ls -A | wc -l"); strings.TrimSpace(got) != "0" {
			t.Errorf("the empty template holds %q entries", got)
		}
		for _, image := range []string{"unknown", "relative/dir", filepath.Join(tmpl, "src", "main.py"), "/no/such/dir"} {
			if _, err := p.Start(ctx, provider.Spec{Image: image}); !errors.Is(err, provider.ErrInvalidSpec) {
				t.Errorf("Start(image %q): %v, want ErrInvalidSpec", image, err)
			}
		}
		for _, w := range []string{"relative", "/"} {
			if _, err := p.Start(ctx, provider.Spec{Workdir: w}); !errors.Is(err, provider.ErrInvalidSpec) {
				t.Errorf("Start(workdir %q): %v, want ErrInvalidSpec", w, err)
			}
		}
		if _, err := p.Start(ctx, provider.Spec{TTLSeconds: -1}); !errors.Is(err, provider.ErrInvalidSpec) {
			t.Errorf("negative ttl: %v", err)
		}
		// A refused start leaves no directory behind.
		ids, err := p.sandboxIDs()
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) != 3 {
			t.Errorf("%d sandbox directories, want the 3 started", len(ids))
		}
	})
}

func TestStartHonoursItsContext(t *testing.T) {
	p := newProvider(t, mode{"none-copy", IsolationNone, OverlayOff}, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Start(ctx, provider.Spec{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Start on a done context: %v", err)
	}
	if _, err := p.Fork(ctx, provider.Spec{}, "snap-0000000000000000"); !errors.Is(err, context.Canceled) {
		t.Errorf("Fork on a done context: %v", err)
	}
}

func TestContainerIsolation(t *testing.T) {
	for _, ov := range []string{OverlayOff, OverlayOn} {
		t.Run(ov, func(t *testing.T) {
			t.Parallel()
			p := newProvider(t, mode{"container", IsolationContainer, ov}, Options{})
			if p.Isolation() != IsolationContainer {
				t.Fatalf("Isolation() = %q", p.Isolation())
			}
			h := start(t, p, provider.Spec{})
			// The tree is at the workdir; HOME is the workdir.
			if got := mustRun(t, p, h, `pwd; echo "$HOME"`); got != DefaultWorkdir+"\n"+DefaultWorkdir+"\n" {
				t.Errorf("pwd, HOME = %q", got)
			}
			// The host is read-only.
			if res := run(t, p, h, "touch /usr/local-provider-test 2>&1"); res.ExitCode == 0 {
				t.Errorf("wrote the host's /usr: %+v", res)
			}
			if _, err := os.Stat("/usr/local-provider-test"); err == nil {
				os.Remove("/usr/local-provider-test")
				t.Errorf("a sandboxed command wrote the host")
			}
			// /tmp is the sandbox's own: its commands share it, another
			// sandbox and the host do not see it.
			mustRun(t, p, h, "echo x > /tmp/local-provider-test")
			if got := mustRun(t, p, h, "cat /tmp/local-provider-test"); got != "x\n" {
				t.Errorf("the sandbox's next command does not see its /tmp: %q", got)
			}
			if _, err := os.Stat("/tmp/local-provider-test"); err == nil {
				t.Errorf("a sandboxed command wrote the host's /tmp")
			}
			// Other sandboxes (the provider's root) are hidden.
			other := start(t, p, provider.Spec{Files: map[string]string{"secret": "s"}})
			if res := run(t, p, other, "cat /tmp/local-provider-test"); res.ExitCode == 0 {
				t.Errorf("a sandbox read another's /tmp: %+v", res)
			}
			if res := run(t, p, h, "cat "+filepath.Join(fsDir(p, other), "secret")); res.ExitCode == 0 {
				t.Errorf("a sandbox read another's file: %+v", res)
			}
			// No network but loopback, unless the spec asks.
			// (/proc is the sandbox's own; /sys is the host's, read-only.)
			ifaces := "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"
			if got := mustRun(t, p, h, ifaces); strings.TrimSpace(got) != "lo" {
				t.Errorf("without network the interfaces are %q", got)
			}
			netH := start(t, p, provider.Spec{Network: true})
			if got := mustRun(t, p, netH, ifaces); strings.TrimSpace(got) == "lo" {
				t.Errorf("with network only lo is there")
			}
			// Root in the sandbox cannot remount the host read-write.
			if res := run(t, p, h, "mount -o remount,rw / 2>&1"); res.ExitCode == 0 {
				t.Errorf("remounted /: %+v", res)
			}
		})
	}
}

func TestContainerWorkdirs(t *testing.T) {
	p := newProvider(t, mode{"container", IsolationContainer, OverlayOff}, Options{})
	ctx := context.Background()
	// A workdir under a host directory bound read-only cannot be made.
	if _, err := p.Start(ctx, provider.Spec{Workdir: "/usr/no-such-dir-here"}); !errors.Is(err, provider.ErrInvalidSpec) {
		t.Errorf("workdir under /usr: %v", err)
	}
	if _, err := p.Start(ctx, provider.Spec{Workdir: "/proc/x"}); !errors.Is(err, provider.ErrInvalidSpec) {
		t.Errorf("workdir under /proc: %v", err)
	}
	for _, w := range []string{"/testbed", "/tmp/wd", "/opt"} {
		if _, err := os.Stat(filepath.Dir(w)); err != nil {
			continue
		}
		h, err := p.Start(ctx, provider.Spec{Workdir: w, Files: map[string]string{"f": "x"}})
		if err != nil {
			t.Errorf("workdir %s: %v", w, err)
			continue
		}
		if got := mustRun(t, p, h, "pwd; cat f"); got != w+"\nx" {
			t.Errorf("workdir %s: %q", w, got)
		}
	}
}

func TestUnisolatedCommandsRunInTheHostDirectory(t *testing.T) {
	p := newProvider(t, mode{"none", IsolationNone, OverlayOff}, Options{})
	if p.Isolation() != IsolationNone {
		t.Fatalf("Isolation() = %q", p.Isolation())
	}
	h := start(t, p, provider.Spec{})
	if got := strings.TrimSpace(mustRun(t, p, h, "pwd")); got != fsDir(p, h) {
		t.Errorf("pwd = %q, want %q", got, fsDir(p, h))
	}
}

func TestAutoModesPickWhatWorks(t *testing.T) {
	p, err := New(Options{Root: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stopAll(t, p)
		_ = p.Close() // what it made ahead, disks mounted, goes
	})
	_, ctrErr := New(Options{Root: t.TempDir(), Isolation: IsolationContainer, Overlay: OverlayOff})
	if want := map[bool]string{true: IsolationContainer, false: IsolationUnavailable}[ctrErr == nil]; p.Isolation() != want {
		t.Errorf("auto isolation = %q, want %q (container error: %v)", p.Isolation(), want, ctrErr)
	}
	_, ovErr := New(Options{Root: t.TempDir(), Isolation: IsolationNone, Overlay: OverlayOn})
	if p.Overlay() != (ovErr == nil) {
		t.Errorf("auto overlay = %v, but overlay on gives %v", p.Overlay(), ovErr)
	}
	if ctrErr != nil {
		t.Skipf("SKIP: containers cannot be made here: %v", ctrErr)
	}
	h := start(t, p, provider.Spec{})
	if got := mustRun(t, p, h, "echo ok"); got != "ok\n" {
		t.Errorf("auto: %q", got)
	}
}

// Where the kernel refuses the namespaces a container is made of, auto
// says so (Isolation, IsolationError) and starts no sandbox, never an
// unisolated one; container and bwrap refuse to make a provider; none
// runs unisolated.
func TestAKernelThatRefusesContainersGetsNoUnisolatedSandbox(t *testing.T) {
	refused := errors.New("clone: operation not permitted")
	probe := func() error { return refused }
	p, err := New(Options{Root: t.TempDir(), Overlay: OverlayOff, Logger: testLogger(t), probeIsolation: probe})
	if err != nil {
		t.Fatal(err)
	}
	if p.Isolation() != IsolationUnavailable || !errors.Is(p.IsolationError(), ErrIsolationUnavailable) || !strings.Contains(p.IsolationError().Error(), refused.Error()) {
		t.Errorf("auto on a refusing kernel: isolation %q, error %v", p.Isolation(), p.IsolationError())
	}
	if err := p.Unreachable(); !errors.Is(err, ErrIsolationUnavailable) {
		t.Errorf("Unreachable on a refusing kernel: %v, want ErrIsolationUnavailable", err)
	}
	if _, err := p.Start(context.Background(), provider.Spec{}); !errors.Is(err, ErrIsolationUnavailable) || !errors.Is(err, provider.ErrUnavailable) {
		t.Errorf("Start on a refusing kernel: %v, want ErrIsolationUnavailable and provider.ErrUnavailable", err)
	}
	for _, mode := range []string{IsolationContainer, IsolationBwrap} {
		if _, err := New(Options{Root: t.TempDir(), Isolation: mode, Overlay: OverlayOff, probeIsolation: probe}); !errors.Is(err, ErrIsolationUnavailable) {
			t.Errorf("isolation %s on a refusing kernel: %v, want ErrIsolationUnavailable", mode, err)
		}
	}
	q, err := New(Options{Root: t.TempDir(), Isolation: IsolationNone, Overlay: OverlayOff, probeIsolation: probe})
	if err != nil || q.Isolation() != IsolationNone || q.IsolationError() != nil || q.Unreachable() != nil {
		t.Fatalf("isolation none: %v, %v", q, err)
	}
	t.Cleanup(func() { stopAll(t, q) })
	h := start(t, q, provider.Spec{})
	if got := mustRun(t, q, h, "echo ok"); got != "ok\n" {
		t.Errorf("none: %q", got)
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	for name, o := range map[string]Options{
		"no root":           {},
		"isolation":         {Root: t.TempDir(), Isolation: "docker"},
		"overlay":           {Root: t.TempDir(), Overlay: "maybe"},
		"relative workdir":  {Root: t.TempDir(), DefaultWorkdir: "sandbox"},
		"root as a workdir": {Root: t.TempDir(), DefaultWorkdir: "/"},
	} {
		if _, err := New(o); !errors.Is(err, ErrBadOptions) {
			t.Errorf("%s: %v, want ErrBadOptions", name, err)
		}
	}
}

// Isolated, a command that leaves its process group (setsid) lives
// until the sandbox stops, and no longer: the sandbox's pid namespace goes
// with its init.
func TestContainerCommandsCannotEscapeTheirSandbox(t *testing.T) {
	p := newProvider(t, mode{"container", IsolationContainer, OverlayOff}, Options{})
	h := start(t, p, provider.Spec{})
	res := run(t, p, h, "setsid sleep 600 > /dev/null 2>&1 < /dev/null & echo started")
	if res.Stdout != "started\n" {
		t.Errorf("got %+v", res)
	}
	if pids := waitCommandPids(p, h.SandboxID, 1); len(pids) != 1 {
		t.Errorf("the setsid process: %v, want one", pids)
	}
	if err := p.Stop(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	if pids := markedProcesses(h.SandboxID); len(pids) != 0 {
		for _, pid := range pids {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			c, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			t.Logf("%s %q", b, c)
		}
		t.Errorf("a setsid process outlived its sandbox: %v", pids)
	}
}

// uid_range is checked at New: a range holding a host user's or group's
// id, or the storage uid, is refused, as is one that does not parse.
func TestUIDRangeIsChecked(t *testing.T) {
	for _, r := range []string{"1-100", "65000-66000", "x", "10-5", "0-10", "5"} {
		_, err := New(Options{Root: t.TempDir(), Isolation: IsolationContainer, Overlay: OverlayOff, UIDRange: r})
		if !errors.Is(err, ErrBadOptions) {
			t.Errorf("uid_range %q: %v, want ErrBadOptions", r, err)
		}
	}
	// Unisolated, or with none, no range is used.
	for _, o := range []Options{{Isolation: IsolationNone}, {Isolation: IsolationContainer, UIDRange: UIDRangeNone}} {
		o.Root, o.Overlay = t.TempDir(), OverlayOff
		p, err := New(o)
		if err != nil || p.uids != nil {
			t.Errorf("%+v: %v, range %v", o, err, p)
		}
	}
}

// Each sandbox takes a uid of the range no live sandbox holds, a stopped
// one gives it back, and a restarted server holds those of the sandboxes
// it finds.
func TestEachSandboxTakesAFreeUIDOfTheRange(t *testing.T) {
	root := t.TempDir()
	p := newProvider(t, mode{"container-copy", IsolationContainer, OverlayOff}, Options{Root: root, UIDRange: "1879113000-1879113001"})
	ctx := context.Background()
	a := start(t, p, provider.Spec{})
	b := start(t, p, provider.Spec{})
	if _, err := p.Start(ctx, provider.Spec{}); !errors.Is(err, uidrange.ErrExhausted) {
		t.Errorf("a third sandbox in a range of two: %v, want uidrange.ErrExhausted", err)
	}
	ua, ub := hostUID(t, p, a), hostUID(t, p, b)
	if ua == ub || min(ua, ub) != 1879113000 || max(ua, ub) != 1879113001 {
		t.Errorf("uids %d and %d, want the range's two", ua, ub)
	}
	if err := p.Stop(ctx, a); err != nil {
		t.Fatal(err)
	}
	c := start(t, p, provider.Spec{})
	if uc := hostUID(t, p, c); uc != ua {
		t.Errorf("the next sandbox got %d, want the stopped one's %d", uc, ua)
	}
	q, err := New(Options{Root: root, Isolation: IsolationContainer, Overlay: OverlayOff, UIDRange: "1879113000-1879113001"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Start(ctx, provider.Spec{}); !errors.Is(err, uidrange.ErrExhausted) {
		t.Errorf("a restarted server gave out a uid its sandboxes hold: %v", err)
	}
}

// An isolated init runs a binary it holds through the server's own mount
// of it, not through the copy of the host's root its mount namespace
// began with: that copy holds every host mount beneath it (a few per live
// sandbox), so each init would keep all of them for its life, and the
// host's kernel memory would grow with the square of the sandboxes.
func TestAnInitHoldsNoCopyOfTheHostsMounts(t *testing.T) {
	p := newProvider(t, mode{"container", IsolationContainer, OverlayOn}, Options{})
	h := start(t, p, provider.Spec{})
	mustRun(t, p, h, "true") // the init runs
	pid := initPid(p, h)
	mountOf := func(path string) uint64 {
		t.Helper()
		var st unix.Statx_t
		if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_MNT_ID, &st); err != nil {
			t.Fatal(err)
		}
		return st.Mnt_id
	}
	bin, err := p.initBinary()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := mountOf("/proc/"+strconv.Itoa(pid)+"/exe"), mountOf(bin); got != want {
		t.Errorf("the init's binary is held through mount %d, want the server's mount of it, %d", got, want)
	}
}
