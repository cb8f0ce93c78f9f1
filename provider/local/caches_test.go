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

func TestCachesAreSharedReadWriteAndNotSnapshotted(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		placed := t.TempDir()
		p := newProvider(t, m, Options{Caches: map[string]string{"placed": placed}})
		spec := provider.Spec{
			Env: map[string]string{"C1": "/caches/one", "C2": "/caches/placed/sub"},
			ProviderOptions: map[string]any{CachesOption: map[string]any{
				"one": "/caches/one", "placed": "/caches/placed",
			}},
		}
		a, b := start(t, p, spec), start(t, p, spec)
		mustRun(t, p, a, `mkdir -p "$C2" && echo from-a > "$C1/f" && echo deep > "$C2/g"`)
		if got := mustRun(t, p, b, `cat "$C1/f" "$C2/g"`); got != "from-a\ndeep\n" {
			t.Errorf("b reads %q from the caches a wrote", got)
		}
		if got, err := os.ReadFile(filepath.Join(placed, "sub", "g")); err != nil || string(got) != "deep\n" {
			t.Errorf("the placed cache's host directory holds %q, %v", got, err)
		}
		if _, err := os.Stat(filepath.Join(p.Root(), "caches", "one", "f")); err != nil {
			t.Errorf("an unplaced cache is not under <root>/caches: %v", err)
		}
		// A snapshot does not copy the cache; a fork that names it shares it.
		f, err := p.Fork(context.Background(), spec, snapshot(t, p, a))
		if err != nil {
			t.Fatal(err)
		}
		mustRun(t, p, b, `echo later > "$C1/f"`)
		if got := mustRun(t, p, f, `cat "$C1/f"`); got != "later\n" {
			t.Errorf("the fork reads %q from the cache", got)
		}
		if strings.Contains(mustRun(t, p, a, "ls -a"), "caches") {
			t.Error("the cache shows in the sandbox's tree")
		}
	})
}

func TestCacheOptionsAreChecked(t *testing.T) {
	t.Parallel()
	p := newProvider(t, mode{"none-copy", IsolationNone, OverlayOff}, Options{})
	for name, opt := range map[string]any{
		"not a map":          "x",
		"path not a string":  map[string]any{"a": 3},
		"relative path":      map[string]any{"a": "caches/a"},
		"the root":           map[string]any{"a": "/"},
		"bad name":           map[string]any{"../a": "/caches/a"},
		"inside the workdir": map[string]any{"a": "/sandbox/cache"},
		"is the workdir":     map[string]any{"a": "/sandbox"},
		"two at one path":    map[string]any{"a": "/caches/x", "b": "/caches/x"},
	} {
		_, err := p.Start(context.Background(), provider.Spec{ProviderOptions: map[string]any{CachesOption: opt}})
		if !errors.Is(err, provider.ErrInvalidSpec) {
			t.Errorf("%s: err = %v, want ErrInvalidSpec", name, err)
		}
	}
	if _, err := New(Options{Root: t.TempDir(), Caches: map[string]string{"a/b": "/x"}}); !errors.Is(err, ErrBadOptions) {
		t.Errorf("bad cache name in options: err = %v", err)
	}
}
