package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxowner/owner/provider"
)

// A sandbox whose processes fork as fast as they can is killed whole, in
// one round (the test allows no other): the kernel's cgroup.kill (v2), or a freeze before the kills
// (v1), leaves none a fork could save. Where the pids limit holds the
// storm is a fork bomb at the limit (every process forking two copies of
// itself forever, each slot a kill frees taken again at once); elsewhere
// (the pure v2 host, which has no pids controller) loopers forking short
// children, bounded by their own waits. Every process ends, and the stop
// after removes the cgroups.
func TestAForkingSandboxIsKilledWhole(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		p := newProvider(t, m, Options{Limits: Limits{Pids: 128, DiskMB: -1}})
		if p.cg == nil {
			t.Skip("SKIP: no cgroups here")
		}
		bomb := strings.Contains(p.LimitsInEffect(), "pids")
		h := start(t, p, provider.Spec{})
		g := p.cg.of(h.SandboxID)
		mark := "storm-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 10)
		script := `for i in 1 2 3 4 5 6 7 8; do (while :; do (:) & (:) & wait; done) & done; wait`
		if bomb {
			script = `f() { while :; do f & f & wait; done; }; f`
		}
		mustRun(t, p, h, fmt.Sprintf("sh -c '%s' %s >/dev/null 2>&1 &", script, mark))
		// Racing: at the pids limit (a fork refused), or every looper up.
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
			if bomb && pidsEventsMax(t, g) > 0 || !bomb && len(procsWith([]string{mark})) > 8 {
				break
			}
			if time.Now().After(deadline) { // a hang guard
				t.Fatalf("the storm never got going: %d processes", len(procsWith([]string{mark})))
			}
		}
		// The kernel kills (v2), or the signals go to frozen processes.
		var during []string
		g.beforeKill = func() {
			state := "no freezer"
			if g.canFreeze() {
				b, _ := os.ReadFile(filepath.Join(g.dirs["freezer"], "freezer.state"))
				state = strings.TrimSpace(string(b))
			}
			during = append(during, state)
		}
		// Asked before the kill: once the init is gone its cgroup may be too.
		_, noKill := os.Stat(filepath.Join(g.dirs["freezer"], "cgroup.kill"))
		// One round, however long its processes take to die: they die
		// as the scheduler runs them, which a loaded machine did later
		// than the second after which kill makes another round, and a
		// second round then failed the test though the first had killed
		// them all. What the round leaves alive keeps forking in the
		// cgroup, and the wait below never ends.
		g.roundEvery = time.Hour
		found, rounds := g.kill()
		want := []string{"FROZEN"}
		switch {
		case g.v2 && noKill == nil:
			want = nil
		case g.v2:
			want = during // a kernel before cgroup.kill: the v2 freezer's file is another
		case !g.canFreeze():
			want = []string{"no freezer"}
		}
		if !slices.Equal(during, want) {
			t.Errorf("the signals went to processes %q, want %q", during, want)
		}
		t.Logf("the kill found %d processes, in %d rounds", found, rounds)
		if found == 0 {
			t.Error("the kill found no process")
		}
		for bound := time.Now().Add(time.Minute); len(g.pids()) > 0; time.Sleep(pollEvery) {
			if time.Now().After(bound) { // a hang guard
				t.Errorf("processes left in the sandbox's cgroups a minute after its kill round: %v", g.pids())
				break
			}
		}
		if left := procsWith([]string{mark}); len(left) > 0 {
			t.Errorf("storm processes outlived the kill: %v", left)
		}
		if err := p.Stop(context.Background(), h); err != nil {
			t.Fatal(err)
		}
		for c, dir := range g.dirs {
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the sandbox's %s cgroup after its stop: %v, want it removed", c, err)
			}
		}
	})
}

// pidsEventsMax is how many forks the sandbox's pids limit refused.
func pidsEventsMax(t *testing.T, g *sandboxCgroup) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(g.dirs["pids"], "pids.events"))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(b)), "max")))
	return n
}
