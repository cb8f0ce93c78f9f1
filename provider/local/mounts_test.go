package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
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
