package control

import (
	"context"
	"slices"
	"sync"

	"github.com/sandboxowner/owner/internal/broadcast"
	"github.com/sandboxowner/owner/sched"
)

// Gate is the admission gate of the data plane. While it is closed, requests
// that must wait do (Enter blocks); the requests it admits are counted per
// session until they Leave, so a prepare knows when none is in flight and a
// retire can wait for one session's requests to end. It is safe for
// concurrent use.
type Gate struct {
	rt       sched.Runtime
	mu       sync.Mutex
	open     chan struct{} // closed while admission is open
	isOpen   bool
	stopping chan struct{}
	stopped  bool
	inflight int
	waiting  int
	// sessions holds slots by value: a request of a session with none in
	// flight adds one without an allocation.
	sessions map[string]slot

	changed  *broadcast.Broadcast
	onChange func()
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
	return &Gate{
		rt:       sched.Or(rt),
		open:     open,
		isOpen:   true,
		stopping: make(chan struct{}),
		sessions: map[string]slot{},
		changed:  broadcast.New(),
		onChange: onChange,
	}
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
	g.mu.Lock()
	for e.Wait && !g.isOpen {
		if g.stopped {
			g.mu.Unlock()
			return nil, ErrShuttingDown.With("the server is stopping")
		}
		open, stopping := g.open, g.stopping
		g.waiting++
		g.mu.Unlock()
		g.changed.Fire()
		g.rt.Await(ctx, func() bool { return sched.Closed(open) || sched.Closed(stopping) })
		// An opening wins over an ended context, in a fixed order (select
		// would pick at random).
		if !sched.Closed(open) && !sched.Closed(stopping) {
			select {
			case <-open:
			case <-stopping:
			case <-ctx.Done():
				g.mu.Lock()
				g.waiting--
				g.mu.Unlock()
				return nil, ErrAdmissionClosed.With("gave up waiting for a checkpoint to end: %v", ctx.Err())
			}
		}
		g.mu.Lock()
		g.waiting--
	}
	g.inflight++
	s := g.sessions[e.Session]
	s.n++
	s.label = e.Label
	g.sessions[e.Session] = s
	g.mu.Unlock()
	g.changed.Fire()
	var once sync.Once
	return func() { once.Do(func() { g.leave(e.Session) }) }, nil
}

func (g *Gate) leave(session string) {
	g.mu.Lock()
	g.inflight--
	if s, ok := g.sessions[session]; ok {
		s.n--
		if s.n <= 0 {
			delete(g.sessions, session)
		} else {
			g.sessions[session] = s
		}
	}
	g.mu.Unlock()
	g.changed.Fire()
	if g.onChange != nil {
		g.onChange()
	}
}

// Close makes waiting requests wait. Requests already admitted go on.
func (g *Gate) Close() {
	g.mu.Lock()
	if g.isOpen {
		g.isOpen = false
		g.open = make(chan struct{})
	}
	g.mu.Unlock()
	g.changed.Fire()
}

// Open lets waiting and new requests in.
func (g *Gate) Open() {
	g.mu.Lock()
	if !g.isOpen {
		g.isOpen = true
		close(g.open)
	}
	g.mu.Unlock()
	g.changed.Fire()
}

// IsOpen reports whether requests are admitted without waiting.
func (g *Gate) IsOpen() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.isOpen
}

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
func (g *Gate) Inflight() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inflight
}

// Waiting is the number of requests waiting for the gate to open.
func (g *Gate) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waiting
}

// Busy returns the sorted labels of the sessions with requests in flight
// (sessions without a label left out).
func (g *Gate) Busy() []string {
	g.mu.Lock()
	out := make([]string, 0, len(g.sessions))
	for _, s := range g.sessions {
		if s.label != "" {
			out = append(out, s.label)
		}
	}
	g.mu.Unlock()
	slices.Sort(out)
	return slices.Compact(out)
}

// Blocking is the number of requests in flight of sessions with a label:
// those a checkpoint waits for.
func (g *Gate) Blocking() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, s := range g.sessions {
		if s.label != "" {
			n += s.n
		}
	}
	return n
}

// InflightOf is the number of a session's requests in flight.
func (g *Gate) InflightOf(session string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.sessions[session].n
}

// Changed returns a channel closed at the gate's next change (a request
// waits, is admitted, leaves, or the gate opens). Tests and WaitIdle wait on it.
func (g *Gate) Changed() <-chan struct{} { return g.changed.Wait() }

// WaitIdle waits until none of the sessions has a request in flight.
func (g *Gate) WaitIdle(ctx context.Context, sessions []string) error {
	for {
		ch := g.changed.Wait()
		busy := false
		g.mu.Lock()
		for _, s := range sessions {
			if _, ok := g.sessions[s]; ok {
				busy = true
				break
			}
		}
		g.mu.Unlock()
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
