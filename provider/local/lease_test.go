package local

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/racebuild"
	"github.com/sandboxowner/owner/provider"
)

func TestReaperDeletesAnExpiredSandboxAndSparesARenewedOne(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		clk := clock.NewManual(t0)
		p := newProvider(t, m, Options{Clock: clk})
		ctx := context.Background()
		expiring := start(t, p, provider.Spec{TTLSeconds: 60})
		renewed := start(t, p, provider.Spec{TTLSeconds: 60})
		unleased := start(t, p, provider.Spec{})

		clk.Advance(30 * time.Second)
		if err := p.Renew(ctx, renewed, clk.Now().Add(120*time.Second)); err != nil {
			t.Fatal(err)
		}
		if reaped, err := p.Reap(ctx); err != nil || len(reaped) != 0 {
			t.Fatalf("at 30s Reap = %v, %v; want nothing", reaped, err)
		}
		clk.Advance(30 * time.Second) // t0+60s: exactly the first expiry
		// Expired but not yet reaped: already gone to every caller.
		if _, err := p.Status(ctx, expiring); !errors.Is(err, provider.ErrSandboxNotFound) {
			t.Errorf("Status of an expired sandbox: %v", err)
		}
		if err := p.Renew(ctx, expiring, clk.Now().Add(time.Hour)); !errors.Is(err, provider.ErrSandboxNotFound) {
			t.Errorf("Renew of an expired sandbox: %v", err)
		}
		reaped, err := p.Reap(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff([]string{expiring.SandboxID}, reaped); d != "" {
			t.Errorf("reaped (-want +got):\n%s", d)
		}
		if _, err := os.Stat(p.sandboxDir(expiring.SandboxID)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the expired sandbox's directory is still there: %v", err)
		}
		for _, h := range []provider.Handle{renewed, unleased} {
			if st, err := p.Status(ctx, h); err != nil || st != provider.StatusRunning {
				t.Errorf("%s: %v, %v", h, st, err)
			}
		}
		clk.Advance(90 * time.Second) // past the renewed lease
		reaped, err = p.Reap(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff([]string{renewed.SandboxID}, reaped); d != "" {
			t.Errorf("second reap (-want +got):\n%s", d)
		}
		list, err := p.ListSandboxes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 1 || list[0].Handle.SandboxID != unleased.SandboxID {
			t.Errorf("left: %+v", list)
		}
	})
}

func TestLeaseSurvivesARestart(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	m := mode{"none-copy", IsolationNone, OverlayOff}
	p1 := newProvider(t, m, Options{Clock: clk})
	h := start(t, p1, provider.Spec{TTLSeconds: 10})
	if err := p1.Renew(context.Background(), h, clk.Now().Add(100*time.Second)); err != nil {
		t.Fatal(err)
	}
	p2 := newProvider(t, m, Options{Root: p1.Root(), Clock: clk})
	clk.Advance(50 * time.Second)
	if reaped, err := p2.Reap(context.Background()); err != nil || len(reaped) != 0 {
		t.Errorf("the renewal was lost over a restart: reaped %v, %v", reaped, err)
	}
	clk.Advance(50 * time.Second)
	if reaped, _ := p2.Reap(context.Background()); len(reaped) != 1 {
		t.Errorf("after the renewed expiry reaped %v", reaped)
	}
}

// TestRunReaperStopsWithItsContext: the reaper reaps on its clock's
// interval, and returns, its timer stopped, once its context ends.
func TestRunReaperStopsWithItsContext(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := clock.NewManual(t0)
	p := newProvider(t, mode{"none-copy", IsolationNone, OverlayOff}, Options{Clock: clk})
	h := start(t, p, provider.Spec{TTLSeconds: 30})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.RunReaper(ctx, time.Minute); close(done) }()
	clk.WaitPending(1, nil)
	// Past the lease and the interval: one reap, then the next interval's
	// timer.
	clk.Advance(time.Minute)
	clk.WaitPending(1, nil)
	// Reaped is stopped and its directory gone (a lease that merely ran
	// out leaves both).
	if _, err := os.Stat(p.sandboxDir(h.SandboxID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after a reap interval past the lease, %s's directory: %v", h.SandboxID, err)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(time.Minute): // a guard against a hang, not a measure of speed
		t.Fatal("RunReaper did not return within a minute of its context's end")
	}
	if n := clk.Pending(); n != 0 {
		t.Fatalf("%d timers left after RunReaper returned", n)
	}
}

func TestListSandboxesCarriesMetadataAndLeases(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := newProvider(t, mode{"none-copy", IsolationNone, OverlayOff}, Options{Clock: clock.NewManual(t0)})
	md := map[string]string{"owner": "o", "session": "s", "checkpoint": "c"}
	h := start(t, p, provider.Spec{Metadata: md, TTLSeconds: 30})
	list, err := p.ListSandboxes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []provider.SandboxInfo{{Handle: h, Status: provider.StatusRunning, Metadata: md, CreatedAt: t0, ExpiresAt: t0.Add(30 * time.Second)}}
	if d := cmp.Diff(want, list); d != "" {
		t.Errorf("list (-want +got):\n%s", d)
	}
}

func TestAForkMadeBeforeARestartIsUsableAfterIt(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		p1 := newProvider(t, m, Options{})
		ctx := context.Background()
		h := start(t, p1, provider.Spec{Files: map[string]string{"notes": "one\n"}, Metadata: map[string]string{"session": "s"}})
		snap := snapshot(t, p1, h)
		f := fork(t, p1, snap)
		mustRun(t, p1, f, "echo two >> notes")
		// The handles go through JSON, as through the snapshot index.
		b, err := json.Marshal([]provider.Handle{h, f})
		if err != nil {
			t.Fatal(err)
		}

		// A new server on the same root (p1 is abandoned, as by a crash).
		crash(p1)
		p2 := newProvider(t, m, Options{Root: p1.Root()})
		var hs []provider.Handle
		if err := json.Unmarshal(b, &hs); err != nil {
			t.Fatal(err)
		}
		if got := mustRun(t, p2, hs[1], "cat notes"); got != "one\ntwo\n" {
			t.Errorf("the fork after a restart holds %q", got)
		}
		if got := readFile(t, p2, fork(t, p2, snap), "notes"); got != "one\n" {
			t.Errorf("a new fork of the old snapshot holds %q", got)
		}
		list, err := p2.ListSnapshots(ctx)
		if err != nil || len(list) != 1 || list[0].ID != snap {
			t.Errorf("snapshots after a restart: %+v, %v", list, err)
		}
		if err := p2.Stop(ctx, hs[0]); err != nil {
			t.Fatal(err)
		}
		if _, err := p2.Status(ctx, hs[0]); !errors.Is(err, provider.ErrSandboxNotFound) {
			t.Errorf("after Stop: %v", err)
		}
	})
}

func TestOverlayTreeIsRemountedWhenFoundUnmounted(t *testing.T) {
	t.Parallel()
	m := mode{"none-overlay", IsolationNone, OverlayOn}
	p1 := newProvider(t, m, Options{})
	h := start(t, p1, provider.Spec{Files: map[string]string{"f": "kept"}})
	// As after a reboot: the mount is gone, the layers are on disk.
	if err := unmount(fsDir(p1, h)); err != nil {
		t.Fatal(err)
	}
	p2 := newProvider(t, m, Options{Root: p1.Root()})
	if got := mustRun(t, p2, h, "cat f"); got != "kept" {
		t.Errorf("after a remount the tree holds %q", got)
	}
}

func TestStopIsIdempotentAndSafe(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		p := newProvider(t, m, Options{})
		ctx := context.Background()
		h := start(t, p, provider.Spec{})
		for i := range 2 {
			if err := p.Stop(ctx, h); err != nil {
				t.Fatalf("Stop #%d: %v", i+1, err)
			}
		}
		for _, id := range []string{"sb-0000000000000000", "../../..", ""} {
			if err := p.Stop(ctx, provider.Handle{SandboxID: id}); err != nil {
				t.Errorf("Stop(%q): %v", id, err)
			}
		}
		if _, err := os.Stat(p.sandboxDir(h.SandboxID)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the tree is still there: %v", err)
		}
		for _, call := range []func() error{
			func() error { _, err := p.Status(ctx, h); return err },
			func() error { _, err := p.Exec(ctx, h, provider.ExecRequest{Command: "true"}); return err },
			func() error { _, err := p.ReadFile(ctx, h, "x"); return err },
			func() error { return p.WriteFile(ctx, h, "x", nil) },
			func() error { _, err := p.Snapshot(ctx, h, ""); return err },
			func() error { return p.Renew(ctx, h, time.Now().Add(time.Hour)) },
		} {
			if err := call(); !errors.Is(err, provider.ErrSandboxNotFound) {
				t.Errorf("a call on a stopped sandbox: %v", err)
			}
		}
	})
}

func TestStopDuringExecEndsTheCommand(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		p := newProvider(t, m, Options{})
		h := start(t, p, provider.Spec{})
		done := execRunning(t, context.Background(), p, h, "sleep 600")
		if err := p.Stop(context.Background(), h); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, provider.ErrSandboxNotFound) {
			t.Errorf("the Exec a Stop interrupted returned %v", err)
		}
	})
}

func TestHandlesAreChecked(t *testing.T) {
	t.Parallel()
	p := newProvider(t, mode{"none-copy", IsolationNone, OverlayOff}, Options{})
	ctx := context.Background()
	h := start(t, p, provider.Spec{})
	for name, bad := range map[string]provider.Handle{
		"other provider": {SandboxID: h.SandboxID, Provider: "opensandbox"},
		"other root":     {SandboxID: h.SandboxID, Provider: Name, Descriptor: json.RawMessage(`{"sandbox_id":"` + h.SandboxID + `","root":"/elsewhere"}`)},
		"id mismatch":    {SandboxID: h.SandboxID, Provider: Name, Descriptor: json.RawMessage(`{"sandbox_id":"sb-1111111111111111"}`)},
		"bad json":       {SandboxID: h.SandboxID, Provider: Name, Descriptor: json.RawMessage(`{`)},
	} {
		if err := p.Stop(ctx, bad); !errors.Is(err, provider.ErrInvalidSpec) {
			t.Errorf("%s: Stop = %v, want ErrInvalidSpec", name, err)
		}
	}
	// An id-only handle is enough.
	if _, err := p.Status(ctx, provider.Handle{SandboxID: h.SandboxID}); err != nil {
		t.Errorf("id-only handle: %v", err)
	}
	var d Descriptor
	if err := json.Unmarshal(h.Descriptor, &d); err != nil {
		t.Fatal(err)
	}
	if d != (Descriptor{SandboxID: h.SandboxID, Root: p.Root(), Workdir: DefaultWorkdir}) {
		t.Errorf("descriptor %+v", d)
	}
}

func TestAFreshProcessStopsASandboxFromItsHandle(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		p := newProvider(t, m, Options{})
		h := start(t, p, provider.Spec{})
		b, _ := json.Marshal(h)
		if out, err := helper(t, m, p.Root(), "stop", string(b), "").CombinedOutput(); err != nil {
			t.Fatalf("helper: %v\n%s", err, out)
		}
		p2 := newProvider(t, m, Options{Root: p.Root()})
		if _, err := p2.Status(context.Background(), h); !errors.Is(err, provider.ErrSandboxNotFound) {
			t.Errorf("after a fresh process stopped it: %v", err)
		}
		if _, err := os.Stat(p.sandboxDir(h.SandboxID)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("its directory is still there: %v", err)
		}
	})
}

// A server killed with SIGKILL mid-command: the next server on the root
// neither finds the command still running nor fails to use or stop the
// sandbox.
func TestACrashedServersCommandsDoNotSurviveIt(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		p := newProvider(t, m, Options{})
		h := start(t, p, provider.Spec{})
		ready := mkfifo(t, p, h, "ready")
		b, _ := json.Marshal(h)
		// sh stays the parent of sleep, so unisolated the sleep outlives the
		// server and its shell (which dies with the server).
		cmd := helper(t, m, p.Root(), "exec", string(b), "echo > ready; sleep 600; echo after")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ready()
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()

		p2 := newProvider(t, m, Options{Root: p.Root()})
		if got := mustRun(t, p2, h, "echo alive"); got != "alive\n" {
			t.Errorf("after the crash: %q", got)
		}
		if pids := commandPids(p2, h.SandboxID); len(pids) != 0 {
			t.Errorf("the crashed server's command still runs: %v", pids)
		}
		if err := p2.Stop(context.Background(), h); err != nil {
			t.Fatal(err)
		}
	})
}

func helper(t *testing.T, m mode, root, action, handle, command string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = racebuild.NoExitSleep(append(os.Environ(), helperEnv+"="+action, "LOCAL_TEST_ROOT="+root,
		"LOCAL_TEST_ISOLATION="+m.isolation, "LOCAL_TEST_OVERLAY="+m.overlay,
		"LOCAL_TEST_HANDLE="+handle, "LOCAL_TEST_COMMAND="+command))
	return cmd
}

func TestReapFinishesWhatACrashLeft(t *testing.T) {
	t.Parallel()
	m := mode{"none-overlay", IsolationNone, OverlayOn}
	p := newProvider(t, m, Options{})
	// A start that died before its metadata file, with its overlay mounted.
	h := start(t, p, provider.Spec{})
	if err := os.Remove(filepath.Join(p.sandboxDir(h.SandboxID), "meta.json")); err != nil {
		t.Fatal(err)
	}
	// A snapshot that died mid-copy, and a stop that died mid-removal.
	if err := os.MkdirAll(filepath.Join(p.snapshotDir("snap-00000000000000aa"), "layer"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(p.trashDir(), "sb-00000000000000bb-x", "fs"), 0o755); err != nil {
		t.Fatal(err)
	}
	p2 := newProvider(t, m, Options{Root: p.Root()})
	if _, err := p2.Reap(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{p.sandboxDir(h.SandboxID), p.snapshotDir("snap-00000000000000aa"), filepath.Join(p.trashDir(), "sb-00000000000000bb-x")} {
		if _, err := os.Stat(d); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s is still there: %v", d, err)
		}
	}
}

func TestDurableMode(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	p := newProvider(t, mode{"none-copy", IsolationNone, OverlayOff}, Options{Durable: true, Clock: clk})
	h := start(t, p, provider.Spec{Files: map[string]string{"f": "x"}, TTLSeconds: 10})
	if err := p.Renew(context.Background(), h, clk.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, p, fork(t, p, snapshot(t, p, h)), "f"); got != "x" {
		t.Errorf("durable fork sees %q", got)
	}
}
