package harness

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider/fake"
)

// Phase is one span of an operation, as the fake's call hook sees it.
type Phase struct {
	Name string
	Took time.Duration // median over the repetitions
}

// Phases splits one commit and one restore of the goal cell into what
// happens before the first provider call, between the first and the last,
// and after: so that a miss of the ideal says where it is.
type Phases struct {
	Sessions, Parallelism int
	Latency               time.Duration
	Reps                  int
	Commit, Restore       []Phase
}

// calls records the first and last time each op's begin and end were seen.
type calls struct {
	mu          sync.Mutex
	first, last map[string]time.Time
}

func newCalls() *calls { return &calls{first: map[string]time.Time{}, last: map[string]time.Time{}} }

func (c *calls) hook(call fake.Call) {
	now := time.Now()
	k := string(call.Op) + "-" + call.Phase
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.first[k]; !ok {
		c.first[k] = now
	}
	c.last[k] = now
}

func (c *calls) at(op fake.Op, phase string, first bool) time.Time {
	k := string(op) + "-" + phase
	if first {
		return c.first[k]
	}
	return c.last[k]
}

// spans runs op reps times with the hook on (setup before and teardown
// after it, untimed and unhooked; either may be nil), and returns the
// medians of the spans between the start, the points cuts picks among the
// calls, and the end.
func spans(fk *fake.Provider, reps int, names []string, setup, teardown func() error, op func(r int) error, cuts func(c *calls) []time.Time) ([]Phase, error) {
	per := make([][]time.Duration, len(names))
	for r := 0; r < reps; r++ {
		if setup != nil {
			if err := setup(); err != nil {
				return nil, err
			}
		}
		c := newCalls()
		fk.SetHook(c.hook)
		var start time.Time
		d, err := timed(func() error {
			start = time.Now()
			return op(r)
		})
		fk.SetHook(nil)
		if err != nil {
			return nil, err
		}
		if teardown != nil {
			if err := teardown(); err != nil {
				return nil, err
			}
		}
		ts := append(append([]time.Time{start}, cuts(c)...), start.Add(d))
		for i := range names {
			per[i] = append(per[i], ts[i+1].Sub(ts[i]))
		}
	}
	out := make([]Phase, len(names))
	for i, n := range names {
		out[i] = Phase{Name: n, Took: median(per[i])}
	}
	return out, nil
}

func (h *harness) phases(ctx context.Context) (*Phases, error) {
	p := &Phases{Sessions: goalSessions, Parallelism: goalParallelism, Latency: goalLatency, Reps: max(1, min(5, h.plan.maxReps))}
	if h.opts.Mode == ModeTiny {
		p.Sessions, p.Parallelism, p.Latency = 10, 4, 2*time.Millisecond
	}
	env, err := newOwnerEnv(ctx, h.tmp, p.Parallelism)
	if err != nil {
		return nil, err
	}
	defer env.remove()
	if err := SeedSessions(ctx, env.o, "s", p.Sessions); err != nil {
		return nil, err
	}
	env.fk.SetLatency(fake.OpSnapshot, p.Latency)
	p.Commit, err = spans(env.fk, p.Reps,
		[]string{"before the first snapshot (session list, round start)", "first snapshot to last", "after the last snapshot (fan-in, index commit)"},
		nil, nil,
		func(r int) error {
			_, err := env.o.Commit(ctx, owner.CommitRequest{CheckpointID: fmt.Sprint("phases-", r)})
			return err
		},
		func(c *calls) []time.Time {
			return []time.Time{c.at(fake.OpSnapshot, fake.PhaseBegin, true), c.at(fake.OpSnapshot, fake.PhaseEnd, false)}
		})
	env.fk.SetLatency(fake.OpSnapshot, 0)
	if err != nil {
		return nil, fmt.Errorf("phases of a commit: %w", err)
	}
	if err := env.close(); err != nil {
		return nil, err
	}
	env.fk.SetLatency(fake.OpFork, p.Latency)
	p.Restore, err = spans(env.fk, p.Reps,
		[]string{"before the first fork (index load, checks)", "first fork to last", "installing the sessions", "stopping the superseded sandboxes", "after"},
		func() error { return env.open(ctx) }, env.close,
		func(int) error {
			_, err := env.o.Restore(ctx, owner.RestoreRequest{CheckpointID: fmt.Sprint("phases-", p.Reps-1)})
			return err
		},
		func(c *calls) []time.Time {
			return []time.Time{
				c.at(fake.OpFork, fake.PhaseBegin, true), c.at(fake.OpFork, fake.PhaseEnd, false),
				c.at(fake.OpStop, fake.PhaseBegin, true), c.at(fake.OpStop, fake.PhaseEnd, false),
			}
		})
	env.fk.SetLatency(fake.OpFork, 0)
	if err != nil {
		return nil, fmt.Errorf("phases of a restore: %w", err)
	}
	return p, nil
}

// PhasesMarkdown is the phases as a table.
func PhasesMarkdown(p *Phases) string {
	var b strings.Builder
	b.WriteString("| operation | phase | median |\n|---|---|---:|\n")
	for _, op := range []struct {
		name string
		ps   []Phase
	}{{OpCommit, p.Commit}, {OpRestore, p.Restore}} {
		var total time.Duration
		for _, ph := range op.ps {
			fmt.Fprintf(&b, "| %s | %s | %s |\n", op.name, ph.Name, fmtDur(ph.Took))
			total += ph.Took
		}
		fmt.Fprintf(&b, "| %s | **sum** | **%s** |\n", op.name, fmtDur(total))
	}
	return b.String()
}
