package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sandboxowner/owner/provider"
)

func TestMountsReadOnlyReadWriteCopyAndOverlay(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		ro, rw, tmpl := t.TempDir(), t.TempDir(), t.TempDir()
		for dir, body := range map[string]string{ro: "ro\n", rw: "rw\n", tmpl: "warm\n"} {
			if err := os.WriteFile(filepath.Join(dir, "f"), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		p := newProvider(t, m, Options{})
		if m.isolation == IsolationContainer {
			// The storage uid's, as what sandboxes wrote through a
			// read-write mount is: an overlay shows it as the sandbox's.
			for _, f := range []string{tmpl, filepath.Join(tmpl, "f")} {
				if err := os.Lchown(f, p.uid, p.gid); err != nil {
					t.Fatal(err)
				}
			}
		}
		spec := provider.Spec{
			Env: map[string]string{"RO": "/env/ro", "RW": "/env/rw", "CP": "/env/cp", "OV": "/env/ov"},
			ProviderOptions: map[string]any{MountsOption: []Mount{
				{Host: ro, Path: "/env/ro", Mode: MountReadOnly},
				{Host: rw, Path: "/env/rw", Mode: MountReadWrite},
				{Host: tmpl, Path: "/env/cp", Mode: MountCopy},
				{Host: tmpl, Path: "/env/ov", Mode: MountOverlay},
			}},
		}
		a, b := start(t, p, spec), start(t, p, spec)
		if got := mustRun(t, p, a, `cat "$RO/f" "$RW/f" "$CP/f" "$OV/f"`); got != "ro\nrw\nwarm\nwarm\n" {
			t.Errorf("the mounts read %q", got)
		}
		mustRun(t, p, a, `echo from-a > "$RW/g" && echo from-a > "$CP/f" && echo new > "$CP/h" && echo from-a > "$OV/f" && echo new > "$OV/h"`)
		if got := mustRun(t, p, a, `cat "$OV/f" "$OV/h"`); got != "from-a\nnew\n" {
			t.Errorf("a's overlay reads %q after it wrote", got)
		}
		if got, _ := os.ReadFile(filepath.Join(rw, "g")); string(got) != "from-a\n" {
			t.Errorf("a read-write mount's host directory holds %q", got)
		}
		// A copy is the sandbox's own: the host directory and the other
		// sandbox's copy are untouched.
		if got, _ := os.ReadFile(filepath.Join(tmpl, "f")); string(got) != "warm\n" {
			t.Errorf("a copy or overlay mount wrote through to its host directory: %q", got)
		}
		if entries, _ := os.ReadDir(tmpl); len(entries) != 1 {
			t.Errorf("the host directory of the copy and the overlay holds %d entries, want its one file", len(entries))
		}
		if got := mustRun(t, p, b, `cat "$CP/f"; ls "$CP"; cat "$OV/f"; ls "$OV"`); got != "warm\nf\nwarm\nf\n" {
			t.Errorf("b's copy and overlay read %q after a wrote its own", got)
		}
		// Isolated on overlays, an overlay entry costs a mount, not a copy.
		writable := p.sandboxDir(a.SandboxID)
		if fi, err := os.Stat(filepath.Join(writable, diskDirName)); err == nil && fi.IsDir() {
			writable = filepath.Join(writable, diskDirName)
		}
		ovDir := mountCopyDir(writable, 3)
		if layered := m.isolation == IsolationContainer && p.Overlay(); isMountRoot(ovDir) != layered {
			t.Errorf("the overlay entry is a mount: %v, want %v", !layered, layered)
		}
		if m.isolation == IsolationContainer {
			if res := run(t, p, a, `echo x > "$RO/f"`); res.ExitCode == 0 {
				t.Error("a read-only mount was written")
			}
		}
		if got, _ := os.ReadFile(filepath.Join(ro, "f")); string(got) != "ro\n" {
			t.Errorf("the read-only mount's host file holds %q", got)
		}
		// A fork gets a fresh copy; the snapshot holds none.
		f, err := p.Fork(context.Background(), spec, snapshot(t, p, a))
		if err != nil {
			t.Fatal(err)
		}
		if got := mustRun(t, p, f, `cat "$CP/f" "$OV/f"`); got != "warm\nwarm\n" {
			t.Errorf("the fork's copy and overlay read %q", got)
		}
		if strings.Contains(mustRun(t, p, a, "ls -a"), "env") {
			t.Error("a mount shows in the sandbox's tree")
		}
		// The copy goes with its sandbox.
		copyDir := mountCopyDir(writable, 2)
		if err := p.Stop(context.Background(), a); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(copyDir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a stopped sandbox's copy is still there: %v", err)
		}
		if _, err := os.Stat(ovDir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a stopped sandbox's overlay is still there: %v", err)
		}
		if got, _ := os.ReadFile(filepath.Join(tmpl, "f")); string(got) != "warm\n" {
			t.Errorf("stopping the sandbox changed the host directory: %q", got)
		}
	})
}

// An overlay or copy mount stacks its lower layers under its host
// directory as overlayfs does: each layer's files show, a nearer layer's
// hiding a farther one's at the same path, and a whiteout hiding what is
// under it; no layer changes.
func TestAnOverlayOrCopyMountStacksItsLowerLayers(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		oldest, middle, newest := t.TempDir(), t.TempDir(), t.TempDir()
		files := map[string]string{
			filepath.Join(oldest, "f"): "old-f\n", filepath.Join(oldest, "g"): "old-g\n", filepath.Join(oldest, "d", "x"): "old-x\n",
			filepath.Join(middle, "g"): "mid-g\n", filepath.Join(middle, "h"): "mid-h\n", filepath.Join(middle, "d", "y"): "mid-y\n",
			filepath.Join(newest, "h"): "new-h\n", filepath.Join(newest, "d", "z"): "new-z\n",
		}
		for f, body := range files {
			if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		p := newProvider(t, m, Options{})
		if m.isolation == IsolationContainer {
			for _, dir := range []string{oldest, middle, newest} {
				if err := filepath.Walk(dir, func(f string, _ os.FileInfo, err error) error {
					if err != nil {
						return err
					}
					return os.Lchown(f, p.uid, p.gid)
				}); err != nil {
					t.Fatal(err)
				}
			}
		}
		spec := provider.Spec{
			Env: map[string]string{"CP": "/env/cp", "OV": "/env/ov"},
			ProviderOptions: map[string]any{MountsOption: []Mount{
				{Host: newest, Path: "/env/cp", Mode: MountCopy, Lower: []string{middle, oldest}},
				{Host: newest, Path: "/env/ov", Mode: MountOverlay, Lower: []string{middle, oldest}},
			}},
		}
		a := start(t, p, spec)
		const want = "old-f\nmid-g\nnew-h\nold-x\nmid-y\nnew-z\n"
		for _, at := range []string{"$CP", "$OV"} {
			if got := mustRun(t, p, a, `cd "`+at+`" && cat f g h d/x d/y d/z`); got != want {
				t.Errorf("%s reads %q, want %q", at, got, want)
			}
			mustRun(t, p, a, `cd "`+at+`" && echo mine > f && rm g`)
			if got := mustRun(t, p, a, `cd "`+at+`" && cat f && ls`); got != "mine\nd\nf\nh\n" {
				t.Errorf("%s after writes reads %q", at, got)
			}
		}
		for f, body := range files {
			if got, err := os.ReadFile(f); string(got) != body {
				t.Errorf("layer file %s holds %q (%v), want %q", f, got, err, body)
			}
		}
		// A fork's spec names the same layers: it gets them again.
		f, err := p.Fork(context.Background(), spec, snapshot(t, p, a))
		if err != nil {
			t.Fatal(err)
		}
		if got := mustRun(t, p, f, `cd "$OV" && cat f g h d/x d/y d/z`); got != want {
			t.Errorf("the fork's overlay reads %q", got)
		}
	})
}

// A copy's merge honours a whiteout of a nearer layer (an overlay's own
// layer, say): what it hides is removed.
func TestMergeTreeRemovesWhatAWhiteoutHides(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	for _, f := range []string{filepath.Join(dst, "gone", "x"), filepath.Join(dst, "kept")} {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mknod(filepath.Join(src, "gone"), syscall.S_IFCHR|0o600, 0); err != nil {
		t.Skipf("SKIP: cannot make a whiteout: %v", err)
	}
	if err := mergeTree(src, dst); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dst)
	if len(entries) != 1 || entries[0].Name() != "kept" {
		t.Errorf("after the merge dst holds %v, want only kept", entries)
	}
}

func TestMountOptionsAreChecked(t *testing.T) {
	t.Parallel()
	p := newProvider(t, mode{"none-copy", IsolationNone, OverlayOff}, Options{})
	host := t.TempDir()
	for name, opt := range map[string]any{
		"not a list":         "x",
		"unknown field":      []any{map[string]any{"host": host, "path": "/m", "mode": "ro", "x": 1}},
		"relative host":      []Mount{{Host: "m", Path: "/m", Mode: MountReadOnly}},
		"missing host":       []Mount{{Host: filepath.Join(host, "none"), Path: "/m", Mode: MountReadOnly}},
		"host in the root":   []Mount{{Host: filepath.Join(p.Root(), "sandboxes"), Path: "/m", Mode: MountReadOnly}},
		"host is the root":   []Mount{{Host: p.Root(), Path: "/m", Mode: MountReadOnly}},
		"relative path":      []Mount{{Host: host, Path: "m", Mode: MountReadOnly}},
		"path is /":          []Mount{{Host: host, Path: "/", Mode: MountReadOnly}},
		"inside the workdir": []Mount{{Host: host, Path: "/sandbox/m", Mode: MountReadOnly}},
		"bad mode":           []Mount{{Host: host, Path: "/m", Mode: "rwx"}},
		"lower of ro":        []Mount{{Host: host, Path: "/m", Mode: MountReadOnly, Lower: []string{host}}},
		"relative lower":     []Mount{{Host: host, Path: "/m", Mode: MountOverlay, Lower: []string{"m"}}},
		"missing lower":      []Mount{{Host: host, Path: "/m", Mode: MountCopy, Lower: []string{filepath.Join(host, "none")}}},
		"lower in the root":  []Mount{{Host: host, Path: "/m", Mode: MountOverlay, Lower: []string{filepath.Join(p.Root(), "sandboxes")}}},
		"two at one path":    []Mount{{Host: host, Path: "/m", Mode: MountReadOnly}, {Host: host, Path: "/m", Mode: MountCopy}},
	} {
		_, err := p.Start(context.Background(), provider.Spec{ProviderOptions: map[string]any{MountsOption: opt}})
		if !errors.Is(err, provider.ErrInvalidSpec) {
			t.Errorf("%s: err = %v, want ErrInvalidSpec", name, err)
		}
	}
	_, err := p.Start(context.Background(), provider.Spec{ProviderOptions: map[string]any{
		MountsOption: []Mount{{Host: host, Path: "/caches/a", Mode: MountReadOnly}},
		CachesOption: map[string]any{"a": "/caches/a"},
	}})
	if !errors.Is(err, provider.ErrInvalidSpec) {
		t.Errorf("a mount at a cache's path: err = %v, want ErrInvalidSpec", err)
	}
}
