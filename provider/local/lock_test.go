package local

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxowner/owner/internal/flock/flocktest"
)

func TestExclusiveRootHasOneProvider(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	opts := Options{Root: root, Isolation: IsolationNone, Overlay: OverlayOff, Exclusive: true}
	first, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(opts)
	if !errors.Is(err, ErrRootLocked) {
		t.Fatalf("a second exclusive provider on the root: %v, want ErrRootLocked", err)
	}
	if want := fmt.Sprintf("held by process %d", os.Getpid()); !strings.Contains(err.Error(), want) {
		t.Errorf("the refusal %q does not say %q", err, want)
	}
	// One not asking for the root (a sweep, a test) is not refused.
	shared, err := New(Options{Root: root, Isolation: IsolationNone, Overlay: OverlayOff})
	if err != nil {
		t.Fatalf("a non-exclusive provider: %v", err)
	}
	_ = shared.Close()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	next, err := New(opts)
	if err != nil {
		t.Fatalf("an exclusive provider after the first closed: %v", err)
	}
	_ = next.Close()
	// A provider that fails after taking the lock lets it go.
	if _, err := New(Options{Root: root, Exclusive: true, Isolation: "nonsense"}); !errors.Is(err, ErrBadOptions) {
		t.Fatalf("bad isolation: %v", err)
	}
	last, err := New(opts)
	if err != nil {
		t.Fatalf("the lock outlived a failed New: %v", err)
	}
	_ = last.Close()
}

// A root a provider closed is free for the next one although a child forked
// meanwhile (a sandbox's start, not yet exec'd) holds a copy of the lock
// file: a server restarted in one process was refused its own root.
func TestAClosedRootIsFreeWhileAForkedChildHoldsCopies(t *testing.T) {
	t.Parallel()
	opts := Options{Root: t.TempDir(), Isolation: IsolationNone, Overlay: OverlayOff, Exclusive: true}
	first, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	flocktest.HoldCopies(t)
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	next, err := New(opts)
	if err != nil {
		t.Fatalf("an exclusive provider after the first closed: %v", err)
	}
	if err := next.Close(); err != nil {
		t.Fatal(err)
	}
}

// The binaries a server placed for its sandboxes' inits are removed by the
// next server that owns the root.
func TestAnOwnerRemovesThePreviousServersInitBinaries(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	p := newProvider(t, mode{"none-copy", IsolationNone, OverlayOff}, Options{Root: root})
	stale := filepath.Join(root, "init-1234")
	if err := os.MkdirAll(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p2, err := New(Options{Root: root, Isolation: IsolationNone, Overlay: OverlayOff, Exclusive: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a previous server's init binary is left: %v", err)
	}
}
