package local

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// A sandbox's limits are the files its cgroups hold, on the kernel: the
// pids cap, memory (and swap with it, where the host accounts swap: v1's
// memsw, v2's swap.max at 0) and the CPU quota over a 100 ms period.
func TestASandboxsLimitsAreWrittenToItsCgroups(t *testing.T) {
	cg := testCgroups(t)
	if cg == nil {
		t.Skip("SKIP: the host lets the server make no cgroup here")
	}
	id := sandboxPrefix + "limits-" + strconv.Itoa(os.Getpid())
	g, err := cg.create(id, Limits{Pids: 7, MemoryMB: 64, CPUs: 1.5})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.remove(); _ = cg.tidy(id) })
	mem := strconv.Itoa(64 << 20)
	want := map[string]string{"pids/pids.max": "7", "memory/memory.limit_in_bytes": mem, "cpu/cpu.cfs_quota_us": "150000", "cpu/cpu.cfs_period_us": "100000"}
	swap := "memory/memory.memsw.limit_in_bytes"
	if cg.v2 {
		want = map[string]string{"pids/pids.max": "7", "memory/memory.max": mem, "cpu/cpu.max": "150000 100000"}
		swap = "memory/memory.swap.max"
	}
	if c, file, _ := strings.Cut(swap, "/"); fileIn(g, c, file) {
		want[swap] = mem
		if cg.v2 {
			want[swap] = "0"
		}
	}
	got := map[string]string{}
	for key := range want {
		c, file, _ := strings.Cut(key, "/")
		if _, ok := g.dirs[c]; !ok {
			delete(want, key) // a controller the host does not give
			continue
		}
		b, err := os.ReadFile(filepath.Join(g.dirs[c], file))
		if err != nil {
			t.Fatal(err)
		}
		got[key] = strings.TrimSpace(string(b))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the sandbox's limit files (-want +got):\n%s", diff)
	}
}

// fileIn reports whether the sandbox's cgroup of controller c has file.
func fileIn(g *sandboxCgroup, c, file string) bool {
	dir, ok := g.dirs[c]
	if !ok {
		return false
	}
	_, err := os.Stat(filepath.Join(dir, file))
	return err == nil
}

// fakeCgroups are v1 parents of controllers cs in directories of the
// test's own: what create and weigh write there is read back.
func fakeCgroups(t *testing.T, cs ...string) *cgroups {
	cg := &cgroups{dirs: map[string]string{}}
	for _, c := range cs {
		cg.dirs[c] = t.TempDir()
	}
	return cg
}

// A limit of zero or below writes nothing (the kernel's default, none,
// stays); swap is capped with memory only where the file for it exists.
func TestOnlyLimitsSetAreWritten(t *testing.T) {
	cg := fakeCgroups(t, "pids", "memory", "cpu")
	for _, l := range []Limits{{}, {Pids: -1, MemoryMB: -1, CPUs: -1}} {
		id := sandboxPrefix + "unlimited" + strconv.Itoa(l.Pids)
		g, err := cg.create(id, l)
		if err != nil {
			t.Fatal(err)
		}
		for c, dir := range g.dirs {
			if entries, _ := os.ReadDir(dir); len(entries) > 0 {
				t.Errorf("limits %+v wrote %s's %v", l, c, entries)
			}
		}
	}
	// No memsw file (a host that does not account swap): none made.
	g, err := cg.create(sandboxPrefix+"noswap", Limits{MemoryMB: 1})
	if err != nil {
		t.Fatal(err)
	}
	if fileIn(g, "memory", "memory.memsw.limit_in_bytes") {
		t.Error("a memsw limit written where the host has no memsw file")
	}
	// With one, swap is capped with memory.
	swapped := filepath.Join(cg.dirs["memory"], sandboxPrefix+"swap")
	if err := os.Mkdir(swapped, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(swapped, "memory.memsw.limit_in_bytes"), []byte("max"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cg.create(sandboxPrefix+"swap", Limits{MemoryMB: 1}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(swapped, "memory.memsw.limit_in_bytes")); string(b) != strconv.Itoa(1<<20) {
		t.Errorf("memsw limit %q, want the memory limit", b)
	}
	// v2: no swap where the host has a swap.max; none made where not.
	v2 := fakeCgroups(t, "memory")
	v2.v2 = true
	swapped = filepath.Join(v2.dirs["memory"], sandboxPrefix+"swap")
	if err := os.Mkdir(swapped, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(swapped, "memory.swap.max"), []byte("max"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"swap", "noswap"} {
		if _, err := v2.create(sandboxPrefix+id, Limits{MemoryMB: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(swapped, "memory.swap.max")); string(b) != "0" {
		t.Errorf("v2 swap limit %q, want 0", b)
	}
	if _, err := os.Stat(filepath.Join(v2.dirs["memory"], sandboxPrefix+"noswap", "memory.swap.max")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a v2 swap limit written where the host has none: %v", err)
	}
}

// The cpu parent's weight: left alone with no weight per sandbox (its
// zero value); else the live sandboxes' count, which a weighing without a
// sandbox (id "") only sets again.
func TestTheCPUParentsWeight(t *testing.T) {
	cg := fakeCgroups(t, "cpu")
	shares := filepath.Join(cg.dirs["cpu"], "cpu.shares")
	if err := os.WriteFile(shares, []byte("777"), 0o644); err != nil {
		t.Fatal(err)
	}
	read := func() string {
		b, _ := os.ReadFile(shares)
		return string(b)
	}
	var got []string
	if err := cg.weigh(sandboxPrefix+"a", true); err != nil {
		t.Fatal(err)
	}
	got = append(got, read())
	cg.weight = cpuWeight{perSandbox: 1, max: 64}
	for _, id := range []string{"a", "b", ""} {
		if err := cg.weigh(id, true); err != nil {
			t.Fatal(err)
		}
		got = append(got, read())
	}
	for _, id := range []string{"a", "b"} {
		if err := cg.weigh(id, false); err != nil {
			t.Fatal(err)
		}
		got = append(got, read())
	}
	if diff := cmp.Diff([]string{"777", "1024", "2048", "2048", "1024", "1024"}, got); diff != "" {
		t.Errorf("the cpu parent's cpu.shares (-want +got):\n%s", diff)
	}
}

// A freeze waits for the kernel's word, and not past its limit or its
// context: here (v2 files of the test's own) the word never comes.
func TestAFreezeTheKernelNeverConfirms(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.events"), []byte("populated 1\nfrozen 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	g := &sandboxCgroup{v2: true, dirs: map[string]string{"freezer": dir}}
	if err := g.freeze(context.Background(), true, 5*pollEvery); !errors.Is(err, errNotStopped) {
		t.Errorf("past its limit: %v, want errNotStopped", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.freeze(ctx, true, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("with its context ended: %v, want context.Canceled", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "cgroup.freeze")); string(b) != "1" {
		t.Errorf("cgroup.freeze %q, want 1", b)
	}
}

// On a v2 kernel without cgroup.kill (before 5.14) a kill round freezes
// the cgroup and signals what it lists then, a process forked before the
// freeze took included. On files of the test's own, as the kernel would
// have them (a cgroup.kill that cannot be written), with real processes
// listed: the second joins the list as the freeze is awaited (the test
// answers the read of cgroup.events through a FIFO), and the hook takes
// them out of the list as the kernel would once they die.
func TestAV2KillWithoutCgroupKillFreezesFirst(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "cgroup.kill"), 0o755); err != nil { // not writable as a file
		t.Fatal(err)
	}
	events := filepath.Join(dir, "cgroup.events")
	if err := syscall.Mkfifo(events, 0o600); err != nil {
		t.Fatal(err)
	}
	var waited []chan error
	var pids []string
	for range 2 {
		sleep := exec.Command("sleep", "600")
		if err := sleep.Start(); err != nil {
			t.Fatal(err)
		}
		w := make(chan error, 1)
		go func() { w <- sleep.Wait() }()
		t.Cleanup(func() { _ = sleep.Process.Kill() })
		waited = append(waited, w)
		pids = append(pids, strconv.Itoa(sleep.Process.Pid))
	}
	procs := filepath.Join(dir, "cgroup.procs")
	if err := os.WriteFile(procs, []byte(pids[0]+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	frozen := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(events, os.O_WRONLY, 0) // once the freeze reads it
		if err == nil {
			err = os.WriteFile(procs, []byte(pids[0]+"\n"+pids[1]+"\n"), 0o644)
			_, _ = f.WriteString("populated 1\nfrozen 1\n")
			f.Close()
		}
		frozen <- err
	}()
	t.Cleanup(func() {
		// A freeze that never read it: the writer's open ends.
		if f, err := os.OpenFile(events, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
	g := &sandboxCgroup{v2: true, dirs: map[string]string{"freezer": dir}}
	var during []string
	g.beforeKill = func() {
		b, _ := os.ReadFile(filepath.Join(dir, "cgroup.freeze"))
		during = append(during, string(b))
		_ = os.WriteFile(procs, nil, 0o644)
	}
	g.roundEvery = time.Hour
	found, rounds := g.kill()
	if err := <-frozen; err != nil {
		t.Fatal(err)
	}
	if found != 2 || rounds != 1 {
		t.Errorf("the kill found %d processes in %d rounds, want 2 in 1", found, rounds)
	}
	if diff := cmp.Diff([]string{"1"}, during); diff != "" {
		t.Errorf("cgroup.freeze as the signals went (-want +got):\n%s", diff)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "cgroup.freeze")); string(b) != "0" {
		t.Errorf("cgroup.freeze after the kill: %q, want 0 (thawed)", b)
	}
	for i, w := range waited {
		select {
		case err := <-w:
			if err == nil || !strings.Contains(err.Error(), "killed") {
				t.Errorf("listed process %d ended with %v, want killed", i, err)
			}
		case <-time.After(time.Minute): // a hang guard
			t.Errorf("listed process %d outlived the kill", i)
		}
	}
}

// A process a kill round cannot end (here one the list names and no
// process is: the kernel's list of a cgroup whose process sits in an
// uninterruptible sleep behaves alike) is killed again a round every
// killRoundEvery, not at every look, and the kill gives up at killLimit.
func TestAKillThatCannotEndAProcessGivesUp(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Skip("SKIP: no pid_max here")
	}
	dir := t.TempDir()
	// No pid reaches pid_max; no freezer: the round only signals.
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strings.TrimSpace(string(b))+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	g := &sandboxCgroup{dirs: map[string]string{"pids": dir}}
	began := time.Now()
	found, rounds := g.kill()
	took := time.Since(began)
	if most := int(killLimit/killRoundEvery) + 1; found != 1 || rounds < 1 || rounds > most {
		t.Errorf("the kill found %d processes in %d rounds, want 1 in 1 to %d", found, rounds, most)
	}
	if took < killLimit {
		t.Errorf("the kill gave up after %v, before killLimit (%v)", took, killLimit)
	}
}
