package owner

import (
	"context"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/sandboxowner/owner/internal/timeouts"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sched"
)

// each runs fn for 0..n-1 concurrently and waits; limited runs hold the
// checkpoint limiter around each call, on at most as many goroutines as it
// has slots, each taking the next call as it finishes one: a goroutine a
// call made a thousand at a restore's start, each growing its stack at its
// first provider call, and handed every slot over by a wake-up, where a
// goroutine that keeps its slot for its next call hands over nothing. A
// context that ends stops the waiting ones.
func (o *Owner) each(ctx context.Context, n int, limited bool, fn func(i int)) {
	var g group
	if !limited {
		for i := 0; i < n; i++ {
			g.Go(o.rt, func() { fn(i) })
		}
		g.Wait(o.rt)
		return
	}
	// The calls beyond the goroutines' first count as queued for a slot
	// until they ask for one, as their own goroutines waiting did; a
	// goroutine's first call counts once it waits, as before.
	workers := min(n, o.limiter.Cap())
	unqueue := o.limiter.Queue(n - workers)
	var next, asked atomic.Int64
	for range workers {
		g.Go(o.rt, func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				acquire := o.limiter.Acquire
				if i >= workers {
					asked.Add(1)
					acquire = o.limiter.AcquireQueued
				}
				if err := acquire(ctx); err != nil {
					return
				}
				fn(i)
				o.limiter.Release()
			}
		})
	}
	g.Wait(o.rt)
	unqueue(n - workers - int(asked.Load()))
}

// group is a sync.WaitGroup whose Go and Wait go through a runtime.
type group struct {
	left atomic.Int64
	wg   sync.WaitGroup
}

// Go runs fn on rt as a member of the group.
func (g *group) Go(rt sched.Runtime, fn func()) {
	g.left.Add(1)
	g.wg.Add(1)
	rt.Go(func() {
		defer g.wg.Done()
		defer g.left.Add(-1)
		fn()
	})
}

// Wait returns once every member has returned.
func (g *group) Wait(rt sched.Runtime) {
	rt.Await(context.Background(), func() bool { return g.left.Load() == 0 })
	g.wg.Wait()
}

// eachOutcome is each for calls that each concern one id: fn returns the id
// and the call's error ("" for an item with nothing to do). It returns the
// ids that succeeded, sorted, and the failures by id.
func (o *Owner) eachOutcome(ctx context.Context, n int, limited bool, fn func(i int) (string, error)) ([]string, map[string]string) {
	var mu sync.Mutex
	var done []string
	failed := map[string]string{}
	o.each(ctx, n, limited, func(i int) {
		id, err := fn(i)
		if id == "" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			failed[id] = err.Error()
			return
		}
		done = append(done, id)
	})
	sort.Strings(done)
	return done, failed
}

// stopMany stops sessions' sandboxes for reason, in parallel (the sessions
// bound their provider calls with the limiter).
func (o *Owner) stopMany(ctx context.Context, sessionIDs []string, reason messages.StopReason) ([]string, map[string]string) {
	return o.eachOutcome(ctx, len(sessionIDs), false, func(i int) (string, error) {
		sid := sessionIDs[i]
		h, err := o.stopSession(ctx, sid, reason)
		if err == nil && h == nil {
			return "", nil // held no sandbox: nothing stopped
		}
		return sid, err
	})
}

func joinFailures(failed map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(failed)) {
		parts = append(parts, k+": "+failed[k])
	}
	return strings.Join(parts, "; ")
}

// stopHandles stops sandboxes that no session holds, at most parallelism
// at once, and reports which stopped.
func (o *Owner) stopHandles(hs []provider.Handle) ([]string, map[string]string) {
	ctx, cancel := context.WithTimeout(o.base, timeouts.Cleanup)
	defer cancel()
	return o.eachOutcome(ctx, len(hs), true, func(i int) (string, error) {
		if hs[i].SandboxID == "" {
			return "", nil
		}
		return hs[i].SandboxID, provider.StopRetrying(ctx, o.prov, hs[i])
	})
}

func toSet(ids []string) map[string]bool {
	m := make(map[string]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}

// turnMutex is a mutex whose Lock waits through a runtime, so that a
// deterministic scheduler runs other work while it waits, and only as long
// as the caller's context lasts. The zero value is unlocked.
type turnMutex struct {
	once sync.Once
	// turn holds a token while the mutex is held.
	turn chan struct{}
}

func (m *turnMutex) ch() chan struct{} {
	m.once.Do(func() { m.turn = make(chan struct{}, 1) })
	return m.turn
}

// Lock takes the turn, or returns ctx's error once ctx ends first (at
// once when it has ended already, even with the turn free).
func (m *turnMutex) Lock(ctx context.Context, rt sched.Runtime) error {
	c := m.ch()
	if err := ctx.Err(); err != nil {
		return err
	}
	// On Det this parks until the turn is free or ctx ends, so that what
	// follows never blocks there; on the real runtime it returns at once
	// and the last select waits.
	rt.Await(ctx, func() bool { return len(c) == 0 })
	select {
	case c <- struct{}{}:
		return nil
	default:
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case c <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TryLock takes the turn if it is free.
func (m *turnMutex) TryLock() bool {
	select {
	case m.ch() <- struct{}{}:
		return true
	default:
		return false
	}
}

// Unlock hands the turn back.
func (m *turnMutex) Unlock() {
	select {
	case <-m.ch():
	default:
		panic("owner: unlock of an unlocked turnMutex")
	}
}
