package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/provider"

	"github.com/sandboxowner/owner/provider/local/sinit"
)

func TestAWriteAfterASnapshotIsNotInItsFork(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		p := newProvider(t, m, Options{})
		h := start(t, p, provider.Spec{Files: map[string]string{"notes": "one\n", "gone": "x"}})
		mustRun(t, p, h, "mkdir -p d/e && echo deep > d/e/f")
		snap := snapshot(t, p, h)
		// Drift after the snapshot: append, add, delete a file and a dir.
		mustRun(t, p, h, "echo two >> notes && echo new > added && rm gone && rm -r d")

		f := fork(t, p, snap)
		want := "one\n|absent|x|deep\n"
		if got := mustRun(t, p, f, "cat notes; printf '|'; cat added 2>/dev/null || printf absent; printf '|'; cat gone; printf '|'; cat d/e/f"); got != want {
			t.Errorf("fork sees %q, want %q", got, want)
		}
		if got := readFile(t, p, h, "notes"); got != "one\ntwo\n" {
			t.Errorf("the original lost its drift: %q", got)
		}
		// The fork's own writes reach neither the snapshot nor the original.
		mustRun(t, p, f, "echo fork >> notes")
		f2 := fork(t, p, snap)
		if got := readFile(t, p, f2, "notes"); got != "one\n" {
			t.Errorf("second fork sees %q", got)
		}
		if got := readFile(t, p, h, "notes"); got != "one\ntwo\n" {
			t.Errorf("the original sees the fork's write: %q", got)
		}
		// A snapshot of the fork (a second generation) carries both.
		snap2 := snapshot(t, p, f)
		mustRun(t, p, f, "rm notes")
		if got := readFile(t, p, fork(t, p, snap2), "notes"); got != "one\nfork\n" {
			t.Errorf("second-generation fork sees %q", got)
		}

		infos, err := p.ListSandboxes(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		from := map[string]string{}
		for _, in := range infos {
			from[in.Handle.SandboxID] = in.FromSnapshot
		}
		if from[f.SandboxID] != snap || from[h.SandboxID] != "" {
			t.Errorf("from_snapshot: %v", from)
		}
	})
}

func TestSnapshotPausesRunningCommands(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		p := newProvider(t, m, Options{})
		h := start(t, p, provider.Spec{})
		states := map[string]string{}
		var mu sync.Mutex
		p.hook = func(stage, id string) {
			mu.Lock()
			defer mu.Unlock()
			states[stage] = sandboxStates(p, id)
		}
		// A setsid child leaves the command's process group: only the
		// freezer holds it.
		done := execRunning(t, context.Background(), p, h, "setsid sh -c 'while :; do :; done' & while :; do :; done")
		snapshot(t, p, h)
		mu.Lock()
		got := fmt.Sprint(states)
		mu.Unlock()
		// While copying every process of the sandbox is stopped (T) or
		// frozen (D); after, none is.
		paused := states["paused"]
		frozen := p.cg != nil && p.cg.dirs["freezer"] != ""
		if !frozen && (!strings.Contains(paused, "T") || strings.Trim(paused, "TtZX") != "") {
			t.Errorf("during the copy the command's processes were %s", got)
		}
		if frozen && (len(paused) < 2 || strings.Trim(paused, "DZX") != "") {
			t.Errorf("during the copy the sandbox's processes were %s, want all frozen", got)
		}
		// After, every process runs again. A thawed or continued process
		// shows its old state until the scheduler runs it, which on a
		// loaded machine can be after the provider's resumed stage (a
		// frozen one is D): the states are read again until none is
		// stopped or frozen. One never woken stays so, and the wait's
		// bound, which only catches that, fails the test.
		for bound := time.Now().Add(2 * time.Minute); ; {
			st := sandboxStates(p, h.SandboxID)
			if !strings.ContainsAny(st, "TtD") {
				break
			}
			if time.Now().After(bound) {
				t.Fatalf("two minutes after the copy the sandbox's processes were still %s (%s)", st, got)
			}
			runtime.Gosched()
		}
		if err := p.Stop(context.Background(), h); err != nil {
			t.Fatal(err)
		}
		<-done
	})
}

// sandboxStates returns the states of the sandbox's processes: those in
// its cgroups where it has a freezer, else those of its running command groups,
// concatenated.
func sandboxStates(p *Provider, id string) string {
	p.mu.Lock()
	s := p.sandboxes[id]
	p.mu.Unlock()
	s.mu.Lock()
	cg := s.cgroup
	s.mu.Unlock()
	if !cg.canFreeze() {
		return groupStates(p, id)
	}
	// A task v2 froze sleeps in the freezer's trap (S, as any sleeper):
	// there the kernel's word is the cgroup's, and every member shows
	// frozen as v1's freezer shows it (D).
	v2Frozen := cg.v2 && v2CgroupFrozen(cg)
	var b strings.Builder
	for _, pid := range cg.pids() {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		if i := strings.LastIndexByte(string(st), ')'); i >= 0 && i+2 < len(st) {
			if c := st[i+2]; v2Frozen && c != 'Z' && c != 'X' {
				b.WriteByte('D')
			} else {
				b.WriteByte(c)
			}
		}
	}
	return b.String()
}

// v2CgroupFrozen says whether the kernel reports every task of the
// sandbox's v2 cgroup frozen (cgroup.events).
func v2CgroupFrozen(cg *sandboxCgroup) bool {
	b, err := os.ReadFile(filepath.Join(cg.dirs["freezer"], "cgroup.events"))
	return err == nil && strings.Contains(string(b), "frozen 1\n")
}

// groupStates returns the states of the processes of the sandbox's running
// command groups, concatenated.
func groupStates(p *Provider, id string) string {
	p.mu.Lock()
	s := p.sandboxes[id]
	p.mu.Unlock()
	s.mu.Lock()
	groups := map[int]bool{}
	for g := range s.groups {
		groups[g] = true
	}
	s.mu.Unlock()
	var b strings.Builder
	for _, e := range sinit.ListProcs() {
		if groups[e.Pgrp] {
			b.WriteByte(e.State)
		}
	}
	return b.String()
}

func TestDeleteSnapshot(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		p := newProvider(t, m, Options{})
		ctx := context.Background()
		h := start(t, p, provider.Spec{Files: map[string]string{"f": "1"}})
		snap := snapshot(t, p, h)
		if err := p.DeleteSnapshot(ctx, "snap-0000000000000000"); err != nil {
			t.Errorf("a missing snapshot: %v", err)
		}
		if err := p.DeleteSnapshot(ctx, "../../etc"); err != nil {
			t.Errorf("a malformed id: %v", err)
		}
		f := fork(t, p, snap)
		if err := p.DeleteSnapshot(ctx, snap); err != nil {
			t.Fatal(err)
		}
		if err := p.DeleteSnapshot(ctx, snap); err != nil {
			t.Errorf("deleted twice: %v", err)
		}
		if list, _ := p.ListSnapshots(ctx); len(list) != 0 {
			t.Errorf("a deleted snapshot is listed: %+v", list)
		}
		if _, err := p.Fork(ctx, provider.Spec{}, snap); !errors.Is(err, provider.ErrSnapshotNotFound) {
			t.Errorf("fork of a deleted snapshot: %v", err)
		}
		// The fork still works; in overlay mode it stands on the layer, which
		// is kept until the fork is gone.
		if got := readFile(t, p, f, "f"); got != "1" {
			t.Errorf("the fork lost its tree: %q", got)
		}
		_, statErr := os.Stat(p.snapshotDir(snap))
		if m.overlay == OverlayOn && statErr != nil {
			t.Errorf("overlay: the layer a live fork stands on was removed: %v", statErr)
		}
		if m.overlay == OverlayOff && !errors.Is(statErr, fs.ErrNotExist) {
			t.Errorf("copy: the deleted snapshot is still on disk: %v", statErr)
		}
		if err := p.Stop(ctx, f); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(p.snapshotDir(snap)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the layer outlived its last fork: %v", err)
		}
	})
}

func TestDeletedSnapshotKeptForASnapshotStandingOnIt(t *testing.T) {
	t.Parallel()
	p := newProvider(t, mode{"none-overlay", IsolationNone, OverlayOn}, Options{})
	ctx := context.Background()
	h := start(t, p, provider.Spec{Files: map[string]string{"a": "1"}})
	s1 := snapshot(t, p, h)
	f1 := fork(t, p, s1)
	writeFile(t, p, f1, "b", "2")
	s2 := snapshot(t, p, f1) // stands on s1's layer
	if err := p.Stop(ctx, f1); err != nil {
		t.Fatal(err)
	}
	if err := p.DeleteSnapshot(ctx, s1); err != nil {
		t.Fatal(err)
	}
	f2 := fork(t, p, s2)
	if got := mustRun(t, p, f2, "cat a b"); got != "12" {
		t.Errorf("fork of the second snapshot sees %q", got)
	}
	if err := p.Stop(ctx, f2); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p.snapshotDir(s1)); err != nil {
		t.Errorf("s1's layer went while s2 stands on it: %v", err)
	}
	if err := p.DeleteSnapshot(ctx, s2); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{s1, s2} {
		if _, err := os.Stat(p.snapshotDir(s)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s outlived everything standing on it: %v", s, err)
		}
	}
}

func TestOverlayChainsAreFlattened(t *testing.T) {
	t.Parallel()
	p := newProvider(t, mode{"none-overlay", IsolationNone, OverlayOn}, Options{})
	// Three layers at most: the chain is flattened within six generations.
	p.maxLayers = 3
	ctx := context.Background()
	h := start(t, p, provider.Spec{})
	want := ""
	for i := range p.maxLayers + 3 {
		mustRun(t, p, h, fmt.Sprintf("echo %d >> log", i))
		want += fmt.Sprintf("%d\n", i)
		next := fork(t, p, snapshot(t, p, h))
		if err := p.Stop(ctx, h); err != nil {
			t.Fatal(err)
		}
		h = next
	}
	if got := readFile(t, p, h, "log"); got != want {
		t.Errorf("after %d generations the log is %q", p.maxLayers+3, got)
	}
	s, err := p.live(ctx, h, false)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(s.meta.Lowers); n > p.maxLayers+1 {
		t.Errorf("the sandbox stands on %d layers, more than %d", n, p.maxLayers+1)
	}
}

func TestForkErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	overlay := newProvider(t, mode{"none-overlay", IsolationNone, OverlayOn}, Options{})
	for _, id := range []string{"snap-0000000000000000", "../x", ""} {
		if _, err := overlay.Fork(ctx, provider.Spec{}, id); !errors.Is(err, provider.ErrSnapshotNotFound) {
			t.Errorf("Fork(%q): %v", id, err)
		}
	}
	if _, err := overlay.Snapshot(ctx, provider.Handle{SandboxID: "sb-0000000000000000"}, ""); !errors.Is(err, provider.ErrSandboxNotFound) {
		t.Errorf("Snapshot of an unknown sandbox: %v", err)
	}
	// An overlay diff cannot be forked by a provider with overlay off on
	// the same root; a copy snapshot can be forked by an overlay provider.
	h := start(t, overlay, provider.Spec{Files: map[string]string{"f": "o"}})
	diff := snapshot(t, overlay, h)
	copyP := newProvider(t, mode{"none-copy", IsolationNone, OverlayOff}, Options{Root: overlay.Root()})
	if _, err := copyP.Fork(ctx, provider.Spec{}, diff); !errors.Is(err, provider.ErrUnsupported) {
		t.Errorf("copy provider forking an overlay diff: %v", err)
	}
	h2 := start(t, copyP, provider.Spec{Files: map[string]string{"f": "c"}})
	full := snapshot(t, copyP, h2)
	if got := readFile(t, overlay, fork(t, overlay, full), "f"); got != "c" {
		t.Errorf("overlay fork of a copy snapshot sees %q", got)
	}
}

func TestListSnapshotsCarriesMetadata(t *testing.T) {
	t.Parallel()
	p := newProvider(t, mode{"none-copy", IsolationNone, OverlayOff}, Options{})
	ctx := context.Background()
	md := map[string]string{"owner": "o1", "session": "s1", "checkpoint": "c1"}
	h := start(t, p, provider.Spec{Metadata: md})
	id, err := p.Snapshot(ctx, h, "ckpt-1")
	if err != nil {
		t.Fatal(err)
	}
	list, err := p.ListSnapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 {
		t.Fatalf("listed %d snapshots", len(list))
	}
	want := provider.SnapshotInfo{ID: id, Name: "ckpt-1", SandboxID: h.SandboxID, Metadata: md, CreatedAt: list[0].CreatedAt}
	if d := cmp.Diff(want, list[0]); d != "" {
		t.Errorf("snapshot info (-want +got):\n%s", d)
	}
}

// OnPause hears of every snapshot once, with the sandbox and a pause that
// covers the copy (the stretch between the "paused" and "resumed" stages)
// and fits inside the call.
func TestSnapshotReportsItsPause(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		var mu sync.Mutex
		var ids []string
		var pauses []time.Duration
		p := newProvider(t, m, Options{OnPause: func(id string, d time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			ids, pauses = append(ids, id), append(pauses, d)
		}})
		h := start(t, p, provider.Spec{Files: map[string]string{"a": "x"}})
		var stages []time.Time
		p.hook = func(stage, _ string) {
			if stage != "turn" {
				stages = append(stages, time.Now())
			}
		}
		t0 := time.Now()
		snapshot(t, p, h)
		call := time.Since(t0)
		mu.Lock()
		defer mu.Unlock()
		if len(ids) != 1 || ids[0] != h.SandboxID || len(stages) != 2 {
			t.Fatalf("OnPause heard %v (stages %d), want once for %s", ids, len(stages), h.SandboxID)
		}
		if copying := stages[1].Sub(stages[0]); pauses[0] < copying || pauses[0] > call {
			t.Errorf("pause %v, want between the copy (%v) and the call (%v)", pauses[0], copying, call)
		}
	})
}

// A snapshot holds its sandbox only once a capture turn is its: with one
// turn, a second snapshot waits unpaused (its sandbox never held, OnPause
// not told) while the first copies, and gives up when its context ends.
func TestSnapshotsTakeTurns(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var paused []string
	p := newProvider(t, allModes()[0], Options{Captures: 1, OnPause: func(id string, _ time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		paused = append(paused, id)
	}})
	a := start(t, p, provider.Spec{Files: map[string]string{"a": "x"}})
	b := start(t, p, provider.Spec{Files: map[string]string{"b": "y"}})
	held, release, waiting := make(chan struct{}), make(chan struct{}), make(chan struct{})
	p.hook = func(stage, id string) {
		switch {
		case stage == "paused" && id == a.SandboxID:
			close(held)
			<-release
		case stage == "turn" && id == b.SandboxID:
			close(waiting)
		}
	}
	done := make(chan error, 1)
	go func() {
		_, err := p.Snapshot(context.Background(), a, "first")
		done <- err
	}()
	<-held
	ctx, cancel := context.WithCancel(context.Background())
	second := make(chan error, 1)
	go func() {
		_, err := p.Snapshot(ctx, b, "second")
		second <- err
	}()
	<-waiting
	cancel()
	if err := <-second; !errors.Is(err, context.Canceled) {
		t.Errorf("the second snapshot, its context ended while the first copied: %v, want context.Canceled", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff([]string{a.SandboxID}, paused); diff != "" {
		t.Errorf("sandboxes paused (-want +got):\n%s", diff)
	}
}

// An exec holds its sandbox's gate only while it sends the command to the
// init, so a snapshot may begin after the send and before the command's
// fork. The init is frozen with the rest of the sandbox, so the command
// runs after the copy, never during it. The test stops the init (SIGSTOP
// from the host) before the send, so that the request is still unread
// when the copy begins, and continues it once the sandbox is paused:
// from then on only the freeze holds it back.
func TestACommandSentAsASnapshotBeginsRunsAfterTheCopy(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		p := newProvider(t, m, Options{})
		h := start(t, p, provider.Spec{Files: map[string]string{"notes": "one\n"}})
		mustRun(t, p, h, "true") // the init runs
		p.mu.Lock()
		s := p.sandboxes[h.SandboxID]
		p.mu.Unlock()
		s.mu.Lock()
		in, cg := s.init, s.cgroup
		s.mu.Unlock()
		if !cg.canFreeze() {
			t.Skip("SKIP: no freezer cgroup here: the snapshot stops the init by signal, which the test's own signals would undo")
		}
		pid := in.cmd.Process.Pid
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for strings.Trim(threadStates(t, pid), "T") != "" {
			if err := pollPause(ctx); err != nil {
				t.Fatalf("the init did not stop: %s", threadStates(t, pid))
			}
		}

		sent := make(chan struct{})
		var unreadAtPause, unreadAfter int
		var during string
		p.hook = func(stage, _ string) {
			switch stage {
			case "sent":
				close(sent)
			case "paused":
				unreadAtPause = unread(t, in.fd)
				// SIGCONT wakes a stopped task before kill returns: from
				// here only the freeze keeps the init from reading.
				if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
					t.Error(err)
				}
				during = threadStates(t, pid)
				if cg.v2 {
					// A continued task runs to v2's freezer trap and
					// sleeps there (S): the kernel says when every task
					// of the cgroup is in it again.
					during = v2FrozenAgain(t, cg, pid)
				}
				unreadAfter = unread(t, in.fd)
			}
		}
		done := make(chan error, 1)
		go func() {
			res, err := p.Exec(ctx, h, provider.ExecRequest{Command: "echo ran >> notes", Timeout: time.Minute})
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("exit %d, stderr %q", res.ExitCode, res.Stderr)
			}
			done <- err
		}()
		<-sent
		snap := snapshot(t, p, h)
		if err := <-done; err != nil {
			t.Fatalf("the exec sent before the snapshot: %v", err)
		}
		if unreadAtPause == 0 {
			t.Fatal("the init had read the request before the sandbox paused: the test did not set up its case")
		}
		if strings.Trim(during, "D") != "" || unreadAfter == 0 {
			t.Errorf("during the copy, continued, the init's threads were %q with %d bytes of requests unread, want all frozen (D) and the request unread", during, unreadAfter)
		}
		if got := readFile(t, p, fork(t, p, snap), "notes"); got != "one\n" {
			t.Errorf("the snapshot holds %q, want the tree before the command", got)
		}
		if got := readFile(t, p, h, "notes"); got != "one\nran\n" {
			t.Errorf("after the snapshot the sandbox holds %q, want the command run", got)
		}
	})
}

// v2FrozenAgain waits until the kernel reports the sandbox's v2 cgroup
// frozen, and then returns pid's threads' states as v1's freezer shows
// them (D each); a minute bounds a broken case, which it returns as the
// threads' states.
func v2FrozenAgain(t *testing.T, cg *sandboxCgroup, pid int) string {
	t.Helper()
	for bound := time.Now().Add(time.Minute); ; runtime.Gosched() {
		if st := threadStates(t, pid); v2CgroupFrozen(cg) {
			return strings.Repeat("D", len(st))
		} else if time.Now().After(bound) {
			return st
		}
	}
}

// threadStates are the states of process pid's threads, concatenated.
func threadStates(t *testing.T, pid int) string {
	t.Helper()
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, task := range tasks {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			continue
		}
		if i := strings.LastIndexByte(string(st), ')'); i >= 0 && i+2 < len(st) {
			b.WriteByte(st[i+2])
		}
	}
	return b.String()
}

// unread is how many bytes the server sent on its control socket fd that
// the init has not read yet.
func unread(t *testing.T, fd int) int {
	t.Helper()
	n, err := unix.IoctlGetInt(fd, unix.SIOCOUTQ)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A snapshot deleted while a fork reads it is kept for that fork: the fork
// succeeds, and once it returns the snapshot goes unless the fork stands
// on it (an overlay layer), then with the fork's stop.
func TestSnapshotDeletedWhileAForkReadsIt(t *testing.T) {
	t.Parallel()
	for _, m := range []mode{{"none-copy", IsolationNone, OverlayOff}, {"none-overlay", IsolationNone, OverlayOn}} {
		t.Run(m.name, func(t *testing.T) {
			p := newProvider(t, m, Options{})
			ctx := context.Background()
			h := start(t, p, provider.Spec{Files: map[string]string{"a": "1"}})
			snap := snapshot(t, p, h)
			p.hook = func(stage, id string) {
				if stage == "fork-read" && id == snap {
					if err := p.DeleteSnapshot(ctx, snap); err != nil {
						t.Error(err)
					}
				}
			}
			f := fork(t, p, snap)
			p.hook = nil
			if got := mustRun(t, p, f, "cat a"); got != "1" {
				t.Errorf("the fork sees %q", got)
			}
			_, err := os.Stat(p.snapshotDir(snap))
			if stands := m.overlay == OverlayOn; stands != (err == nil) {
				t.Fatalf("after the fork (overlay %v): the deleted snapshot's layer: %v", stands, err)
			}
			if _, err := p.Fork(ctx, provider.Spec{}, snap); !errors.Is(err, provider.ErrSnapshotNotFound) {
				t.Errorf("a fork of the deleted snapshot: %v, want ErrSnapshotNotFound", err)
			}
			if err := p.Stop(ctx, f); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(p.snapshotDir(snap)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the layer outlived its last fork: %v", err)
			}
		})
	}
}
