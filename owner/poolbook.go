package owner

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/sandboxowner/owner/provider"
)

// poolBook decides what a warm pool does: a seed claims the oldest ready
// sandbox of its pool (a hit) or finds none (a miss); either way the pool
// is refilled to its size, at most refill starts in flight across every
// pool; a sandbox ready for longer than the idle time is stopped, and a
// pool no seed claimed from is not refilled until one does. A sandbox is
// handed out once: a claim takes it out of the book.
//
// It is pure: the shell (pool.go) holds it under a mutex, starts and stops
// what it says, and tells it what became of each start.
type poolBook struct {
	size, refill int
	maxIdle      time.Duration
	pools        map[string]*poolEntry
	// inFlight counts the starts of every pool not yet ended.
	inFlight int
	// gen numbers the pools: a start ends into the pool it began for, not
	// into one made again under the same key after a drain.
	gen uint64
}

type poolEntry struct {
	gen      uint64
	ready    []pooled
	starting int
	// wanted: a seed claimed from the pool since it last went idle, so it
	// is refilled.
	wanted bool
}

// pooled is one sandbox ready in a pool, and when it got there.
type pooled struct {
	Handle provider.Handle
	At     time.Time
}

func newPoolBook(size, refill int, maxIdle time.Duration) *poolBook {
	if refill < 1 {
		refill = 1
	}
	return &poolBook{size: size, refill: refill, maxIdle: maxIdle, pools: map[string]*poolEntry{}}
}

// claim is a seed of key: the oldest ready sandbox (hit) or none (miss),
// and the starts to begin now, by pool.
func (b *poolBook) claim(key string) (p pooled, hit bool, starts []poolStart) {
	e := b.pools[key]
	if e == nil {
		b.gen++
		e = &poolEntry{gen: b.gen}
		b.pools[key] = e
	}
	e.wanted = true
	if len(e.ready) > 0 {
		p, hit = e.ready[0], true
		e.ready = e.ready[1:]
	}
	return p, hit, b.fill(key, nil)
}

// poolStart is one start to begin: for key's pool of generation gen.
type poolStart struct {
	Key string
	Gen uint64
}

// fill adds to out the starts key's pool may begin, up to its size and
// within the refill bound.
func (b *poolBook) fill(key string, out []poolStart) []poolStart {
	e := b.pools[key]
	for e.wanted && len(e.ready)+e.starting < b.size && b.inFlight < b.refill {
		e.starting++
		b.inFlight++
		out = append(out, poolStart{Key: key, Gen: e.gen})
	}
	return out
}

// started ends start s: its sandbox is ready (ok) or the start failed. A
// sandbox whose pool was drained meanwhile is to be stopped. It returns
// the starts to begin now: the freed slot goes to the first pool short of
// its size, in key order.
func (b *poolBook) started(s poolStart, p pooled, ok bool) (stop bool, starts []poolStart) {
	b.inFlight--
	e := b.pools[s.Key]
	if e == nil || e.gen != s.Gen {
		// Drained meanwhile: what it started goes.
		return ok, b.fillAll()
	}
	e.starting--
	if ok {
		e.ready = append(e.ready, p)
	}
	if !ok {
		// A failed start is not retried at once (the provider may be
		// down): the pool refills at its next claim.
		e.wanted = false
	}
	return false, b.fillAll()
}

func (b *poolBook) fillAll() []poolStart {
	var out []poolStart
	for _, k := range slices.Sorted(maps.Keys(b.pools)) {
		out = b.fill(k, out)
	}
	return out
}

// expire takes out the sandboxes ready since before now less the idle
// time (to stop); a pool that lost one is not refilled until a seed
// claims from it again.
func (b *poolBook) expire(now time.Time) []pooled {
	if b.maxIdle <= 0 {
		return nil
	}
	var out []pooled
	cut := now.Add(-b.maxIdle)
	for _, k := range slices.Sorted(maps.Keys(b.pools)) {
		e := b.pools[k]
		keep := e.ready[:0]
		for _, p := range e.ready {
			if p.At.After(cut) {
				keep = append(keep, p)
			} else {
				out = append(out, p)
			}
		}
		if len(keep) < len(e.ready) {
			e.wanted = false
		}
		e.ready = keep
		if len(e.ready) == 0 && e.starting == 0 && !e.wanted {
			delete(b.pools, k)
		}
	}
	return out
}

// drain takes key's pool out whole (its template was dropped): its ready
// sandboxes to stop; those still starting are stopped when they end.
func (b *poolBook) drain(key string) []pooled {
	e := b.pools[key]
	if e == nil {
		return nil
	}
	delete(b.pools, key)
	return e.ready
}

// drainAll takes every pool out (the owner closes).
func (b *poolBook) drainAll() []pooled {
	var out []pooled
	for _, k := range slices.Sorted(maps.Keys(b.pools)) {
		out = append(out, b.drain(k)...)
	}
	return out
}

// counts are the sandboxes ready in every pool, and those starting.
func (b *poolBook) counts() (ready, starting int) {
	for _, e := range b.pools {
		ready += len(e.ready)
		starting += e.starting
	}
	return ready, starting
}

// sandboxes are the ids of the ready sandboxes.
func (b *poolBook) sandboxes() []string {
	var out []string
	for _, e := range b.pools {
		for _, p := range e.ready {
			out = append(out, p.Handle.SandboxID)
		}
	}
	return out
}

// String is the book's state, for the scripts.
func (b *poolBook) String() string {
	s := fmt.Sprintf("in flight %d\n", b.inFlight)
	for _, k := range slices.Sorted(maps.Keys(b.pools)) {
		e := b.pools[k]
		var ids []string
		for _, p := range e.ready {
			ids = append(ids, fmt.Sprintf("%s@%s", p.Handle.SandboxID, p.At.UTC().Format("15:04:05")))
		}
		s += fmt.Sprintf("%s: gen=%d ready=%s starting=%d wanted=%t\n", k, e.gen, bracket(ids), e.starting, e.wanted)
	}
	return s
}
