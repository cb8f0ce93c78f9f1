package local

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

func TestExclusiveRootHasOneProvider(t *testing.T) {
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
