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
// handed out once: a claim takes it out of the book. A ready sandbox with
// a lease is renewed once a third of it has passed, as a lent one is, and
// stopped if that fails.
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

// pooled is one sandbox ready in a pool, and when it got there; with a
// lease (TTL), when its lease last began.
type pooled struct {
	Handle provider.Handle
	At     time.Time
	TTL    time.Duration
	Leased time.Time
	// renewing: a renewal handed out has not yet ended.
	renewing bool
}

func newPoolBook(size, refill int, maxIdle time.Duration) *poolBook {
	return &poolBook{size: size, refill: max(refill, 1), maxIdle: maxIdle, pools: map[string]*poolEntry{}}
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

// tick is the pools at now: it takes out the sandboxes ready since before
// now less the idle time (to stop; a pool that lost one is not refilled
// until a seed claims from it again), and hands out those a third of whose
// lease has passed (to renew; renewed says how it went).
func (b *poolBook) tick(now time.Time) (stop, renew []pooled) {
	cut := now.Add(-b.maxIdle)
	for _, k := range slices.Sorted(maps.Keys(b.pools)) {
		e := b.pools[k]
		keep := e.ready[:0]
		for _, p := range e.ready {
			if b.maxIdle > 0 && !p.At.After(cut) {
				stop = append(stop, p)
				continue
			}
			if p.TTL > 0 && !p.renewing && p.Leased.Add(p.TTL).Sub(now) <= p.TTL*2/3 {
				p.renewing = true
				renew = append(renew, p)
			}
			keep = append(keep, p)
		}
		if len(keep) < len(e.ready) {
			e.wanted = false
		}
		e.ready = keep
		b.forget(k)
	}
	return stop, renew
}

// renewed ends the renewal of sandbox id: its lease began again at at
// (ok), or the renewal failed and the sandbox is taken out, to stop (its
// lease would run out in the pool): then taken is true. A sandbox a seed
// claimed meanwhile, or whose pool was drained, is not the book's.
func (b *poolBook) renewed(id string, at time.Time, ok bool) (p pooled, taken bool) {
	for _, k := range slices.Sorted(maps.Keys(b.pools)) {
		e := b.pools[k]
		for i := range e.ready {
			if e.ready[i].Handle.SandboxID != id {
				continue
			}
			e.ready[i].renewing = false
			if ok {
				e.ready[i].Leased = at
				return pooled{}, false
			}
			p = e.ready[i]
			e.ready = slices.Delete(e.ready, i, i+1)
			e.wanted = false
			b.forget(k)
			return p, true
		}
	}
	return pooled{}, false
}

// forget drops key's pool once it holds nothing and no seed wants it.
func (b *poolBook) forget(key string) {
	if e := b.pools[key]; len(e.ready) == 0 && e.starting == 0 && !e.wanted {
		delete(b.pools, key)
	}
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
			id := fmt.Sprintf("%s@%s", p.Handle.SandboxID, p.At.UTC().Format("15:04:05"))
			if p.TTL > 0 {
				id += fmt.Sprintf("+lease@%s", p.Leased.UTC().Format("15:04:05"))
			}
			if p.renewing {
				id += "(renewing)"
			}
			ids = append(ids, id)
		}
		s += fmt.Sprintf("%s: gen=%d ready=%s starting=%d wanted=%t\n", k, e.gen, bracket(ids), e.starting, e.wanted)
	}
	return s
}
