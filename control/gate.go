package control

import (
	"context"
	"hash/fnv"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/sandboxowner/owner/internal/broadcast"
	"github.com/sandboxowner/owner/sched"
)

// Gate is the admission gate of the data plane. While it is closed, requests
// that must wait do (Enter blocks); the requests it admits are counted per
// session until they Leave, so a prepare knows when none is in flight and a
// retire can wait for one session's requests to end. It is safe for
// concurrent use.
//
// Every data request enters and leaves it, so an open gate admits without
// its lock: the counts are spread over shards by session, and a request
// counts itself before it reads whether the gate is open (a Close stores
// that before it reads the counts), so a Close either sees the request or
// the request sees the Close, and backs out to wait.
type Gate struct {
	rt sched.Runtime
	// mu guards the phase (open, stopping) and the waiting count; an
	// entering request reads the phase from isOpen alone, without it.
	mu       sync.Mutex
	open     chan struct{} // closed while admission is open
	isOpen   atomic.Bool
	stopping chan struct{}
	stopped  bool
	waiting  int
	inflight atomic.Int64
	shards   [gateShards]gateShard

	changed  *broadcast.Broadcast
	onChange func()
	// tickets are the admitted requests' tickets, reused (see Enter).
	tickets sync.Pool
}

// gateShards is how many locks the sessions' counts are spread over.
const gateShards = 32

// gateShard counts the requests in flight of the sessions hashed to it.
type gateShard struct {
	mu sync.Mutex
	// sessions holds slots by value: a request of a session with none in
	// flight adds one without an allocation.
	sessions map[string]slot
}

type slot struct {
	n     int
	label string
}

// NewGate returns an open gate. onChange (may be nil) is called, without
// the gate's lock, whenever an admitted request leaves.
func NewGate(onChange func()) *Gate { return NewGateOn(onChange, nil) }

// NewGateOn is NewGate whose waiters wait through rt (nil: block).
func NewGateOn(onChange func(), rt sched.Runtime) *Gate {
	open := make(chan struct{})
	close(open)
	g := &Gate{
		rt:       sched.Or(rt),
		open:     open,
		stopping: make(chan struct{}),
		changed:  broadcast.New(),
		onChange: onChange,
	}
	g.isOpen.Store(true)
	for i := range g.shards {
		g.shards[i].sessions = map[string]slot{}
	}
	return g
}

func (g *Gate) shardOf(session string) *gateShard {
	h := fnv.New32a()
	_, _ = h.Write([]byte(session))
	return &g.shards[h.Sum32()%gateShards]
}

// count adds d (1 or -1) to the session's requests in flight.
func (g *Gate) count(e Entry, d int) {
	g.inflight.Add(int64(d))
	sh := g.shardOf(e.Session)
	sh.mu.Lock()
	s := sh.sessions[e.Session]
	s.n += d
	if d > 0 {
		s.label = e.Label
	}
	if s.n <= 0 {
		delete(sh.sessions, e.Session)
	} else {
		sh.sessions[e.Session] = s
	}
	sh.mu.Unlock()
}

// Entry describes one request at the gate.
type Entry struct {
	// Session is the request's session id; Label names it in a prepare's
	// blockers: its capture key. A request with no label (its session
	// runs no episode, so no checkpoint exports it) is counted for its
	// session and in Inflight, but is no blocker and not in Blocking.
	Session, Label string
	// Wait: wait while the gate is closed. A request that does not wait is
	// admitted at once.
	Wait bool
}

// Enter admits a request, waiting first if e.Wait and the gate is closed,
// and counts it. The returned function must be called once the request is
// done. It fails when ctx ends or the gate shuts down while waiting.
func (g *Gate) Enter(ctx context.Context, e Entry) (leave func(), err error) {
	for {
		// Counted first, then the phase read: see Gate.
		g.count(e, 1)
		if !e.Wait || g.isOpen.Load() {
			break
		}
		g.count(e, -1)
		if err := g.await(ctx); err != nil {
			g.changed.Fire()
			return nil, err
		}
	}
	g.changed.Fire()
	// A ticket kept between requests and a closure that names its turn:
	// one allocation, where a sync.Once and its closure were two. A leave
	// counts only while the ticket is still on the turn it was handed out
	// for, so a second call, or one after the ticket went to another
	// request, counts nothing.
	t, _ := g.tickets.Get().(*ticket)
	if t == nil {
		t = &ticket{g: g}
	}
	t.e = e
	turn := t.turn.Load()
	return func() { t.leave(turn) }, nil
}

// ticket is an admitted request's place in the counts, reused once left.
type ticket struct {
	g    *Gate
	e    Entry
	turn atomic.Uint64
}

func (t *ticket) leave(turn uint64) {
	if !t.turn.CompareAndSwap(turn, turn+1) {
		return
	}
	e := t.e
	t.e = Entry{}
	t.g.tickets.Put(t)
	t.g.leave(e)
}

// await waits, counted as waiting, until the gate is open again (or
// stopping, or ctx ends).
func (g *Gate) await(ctx context.Context) error {
	g.mu.Lock()
	if g.stopped {
		g.mu.Unlock()
		return ErrShuttingDown.With("the server is stopping")
	}
	if g.isOpen.Load() {
		// Opened since the request read it closed: enter again.
		g.mu.Unlock()
		return nil
	}
	open, stopping := g.open, g.stopping
	g.waiting++
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.waiting--
		g.mu.Unlock()
	}()
	g.changed.Fire()
	g.rt.Await(ctx, func() bool { return sched.Closed(open) || sched.Closed(stopping) })
	// An opening wins over an ended context, in a fixed order (select
	// would pick at random).
	if sched.Closed(open) || sched.Closed(stopping) {
		return nil
	}
	select {
	case <-open:
	case <-stopping:
	case <-ctx.Done():
		return ErrAdmissionClosed.With("gave up waiting for a checkpoint to end: %v", ctx.Err())
	}
	return nil
}

func (g *Gate) leave(e Entry) {
	g.count(e, -1)
	g.changed.Fire()
	if g.onChange != nil {
		g.onChange()
	}
}

// Close makes waiting requests wait. Requests already admitted go on.
func (g *Gate) Close() {
	g.mu.Lock()
	if g.isOpen.Load() {
		g.open = make(chan struct{})
		g.isOpen.Store(false)
	}
	g.mu.Unlock()
	g.changed.Fire()
}

// Open lets waiting and new requests in.
func (g *Gate) Open() {
	g.mu.Lock()
	if !g.isOpen.Load() {
		g.isOpen.Store(true)
		close(g.open)
	}
	g.mu.Unlock()
	g.changed.Fire()
}

// IsOpen reports whether requests are admitted without waiting.
func (g *Gate) IsOpen() bool { return g.isOpen.Load() }

// Shutdown lets every waiting request go with ErrShuttingDown, so a drain
// does not hang on a checkpoint that will never be resumed.
func (g *Gate) Shutdown() {
	g.mu.Lock()
	if !g.stopped {
		g.stopped = true
		close(g.stopping)
	}
	g.mu.Unlock()
	g.changed.Fire()
}

// Inflight is the number of admitted requests not yet done.
func (g *Gate) Inflight() int { return int(g.inflight.Load()) }

// Waiting is the number of requests waiting for the gate to open.
func (g *Gate) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waiting
}

// Busy returns the sorted labels of the sessions with requests in flight
// (sessions without a label left out).
func (g *Gate) Busy() []string {
	var out []string
	g.each(func(_ string, s slot) {
		if s.label != "" {
			out = append(out, s.label)
		}
	})
	slices.Sort(out)
	return slices.Compact(out)
}

// Blocking is the number of requests in flight of sessions with a label:
// those a checkpoint waits for.
func (g *Gate) Blocking() int {
	n := 0
	g.each(func(_ string, s slot) {
		if s.label != "" {
			n += s.n
		}
	})
	return n
}

// each calls fn on every session with requests in flight, one shard at a
// time under its lock.
func (g *Gate) each(fn func(session string, s slot)) {
	for i := range g.shards {
		sh := &g.shards[i]
		sh.mu.Lock()
		for id, s := range sh.sessions {
			fn(id, s)
		}
		sh.mu.Unlock()
	}
}

// InflightOf is the number of a session's requests in flight.
func (g *Gate) InflightOf(session string) int {
	sh := g.shardOf(session)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.sessions[session].n
}

// Changed returns a channel closed at the gate's next change (a request
// waits, is admitted, leaves, or the gate opens). Tests and WaitIdle wait on it.
func (g *Gate) Changed() <-chan struct{} { return g.changed.Wait() }

// WaitIdle waits until none of the sessions has a request in flight.
func (g *Gate) WaitIdle(ctx context.Context, sessions []string) error {
	for {
		ch := g.changed.Wait()
		busy := slices.ContainsFunc(sessions, func(s string) bool { return g.InflightOf(s) > 0 })
		if !busy {
			return nil
		}
		g.rt.Await(ctx, func() bool { return sched.Closed(ch) })
		if sched.Closed(ch) {
			continue
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ErrDeadlineExceeded.With("requests of retired sessions still in flight: %v", ctx.Err())
		}
	}
}
