package local

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local/sinit"
)

// The user namespace helper was the server's binary run again (under go
// test, the -race test binary) whatever init the provider had: it is now
// the provider's inits' binary in its user namespace mode.
func TestTheNamespaceHelperRunsTheInitsBinary(t *testing.T) {
	p := newProvider(t, mode{"container-overlay", IsolationContainer, OverlayOn}, Options{})
	h := start(t, p, provider.Spec{})
	mustRun(t, p, h, "true")
	p.ns.mu.RLock()
	cmd := p.ns.cmd
	p.ns.mu.RUnlock()
	if cmd == nil {
		t.Skip("SKIP: no user namespace was made here (sandboxes without uids of their own, or no idmapped mounts)")
	}
	bin, err := p.initBinary()
	if err != nil {
		t.Fatal(err)
	}
	if cmd.Path != bin || !cmp.Equal(cmd.Args, []string{sinit.Name, sinit.StageUserNS}) {
		t.Errorf("the helper ran %s %q, want the inits' binary %s %q", cmd.Path, cmd.Args, bin, []string{sinit.Name, sinit.StageUserNS})
	}
}

// The memory probe runs the binary it is given, in its memory probe mode:
// the inits' binary, not the server's.
func TestTheMemoryProbeRunsTheBinaryGiven(t *testing.T) {
	cg := testCgroups(t)
	dir, ok := cg.memoryDir()
	if !ok {
		t.Skip("SKIP: the host lets the server make no memory cgroup here")
	}
	tmp := t.TempDir()
	marker := filepath.Join(tmp, "ran")
	bin := filepath.Join(tmp, "probe")
	// A probe that touches nothing: it is not killed, so the limit is
	// called not enforced, and it says how it was run.
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho \"$@\" > "+marker+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := probeMemory(bin, dir, cg.v2, memProbeLimitMiB); !errors.Is(err, errNotEnforced) {
		t.Errorf("a probe that touches nothing: %v, want errNotEnforced", err)
	}
	b, err := os.ReadFile(marker)
	if err != nil {
		t.Fatalf("the binary given never ran: %v", err)
	}
	if got := strings.TrimSpace(string(b)); got != sinit.StageMemoryProbe {
		t.Errorf("the probe's arguments: %q, want %q", got, sinit.StageMemoryProbe)
	}
}

// The server's own binary is placed as the running file: linked while its
// path still names it, copied from the running file once a new build was
// moved over the path (the link placed the new build, whose inits and
// helpers speak another protocol).
func TestTheServersBinaryIsPlacedAsItRuns(t *testing.T) {
	p := &Provider{root: t.TempDir()}
	dir := t.TempDir()
	running, exe := filepath.Join(dir, "running"), filepath.Join(dir, "server")
	if err := os.WriteFile(running, []byte("the running build"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(running, exe); err != nil {
		t.Fatal(err)
	}
	bin, err := p.placeRunning(exe, running)
	if err != nil {
		t.Fatal(err)
	}
	if !sameFile(bin, running) {
		t.Errorf("the running binary at its own path is copied, not linked")
	}
	// A new build moved over the path.
	next := filepath.Join(dir, "next")
	if err := os.WriteFile(next, []byte("a new build"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(next, exe); err != nil {
		t.Fatal(err)
	}
	bin, err = p.placeRunning(exe, running)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != "the running build" || sameFile(bin, exe) {
		t.Errorf("placed after a new build replaced the path: %q, want a copy of the running build", b)
	}
	// The copy is read through /proc/self/exe, the running file, however
	// its path went.
	bin, err = p.placeRunning(filepath.Join(dir, "gone"), "/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	placed, err1 := os.Stat(bin)
	want, err2 := os.Stat(self)
	if err1 != nil || err2 != nil || placed.Size() != want.Size() || sameFile(bin, self) {
		t.Errorf("the running binary copied through /proc/self/exe: %v, %v (%v, %v)", placed, want, err1, err2)
	}
}
