package actors

import (
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
)

// Mailbox returns the producer of the owner's actors' mailboxes. It is
// protoactor's unbounded mailbox without its allocations: that one made a
// closure every time its mailbox was scheduled (every message that found
// it idle, which is nearly every message: a mailbox runs on the goroutine
// that gave it work), a queue node for every system message, and four
// queues for every actor spawned. A seed and close spawns an actor and
// schedules mailboxes about six times; this one allocates once per actor.
//
// What it keeps of protoactor's: system messages go before user messages;
// a suspended mailbox runs only system messages; a panic in the actor is
// escalated as protoactor's is; a mailbox runs on one goroutine at a time,
// until it finds nothing queued. What it leaves out, which none of the
// owner's actors uses: message batches, middlewares (the session actor's
// late requests are told by hand) and the dispatcher's throughput (a yield
// of the processor after that many messages, which changed no outcome).
func Mailbox() actor.MailboxProducer { return mailboxWith(nil) }

func mailboxWith(late *lateRequests) actor.MailboxProducer {
	return func() actor.Mailbox {
		m := &mailbox{}
		m.init(late)
		return m
	}
}

func (m *mailbox) init(late *lateRequests) {
	m.late = late
	m.sys.buf, m.user.buf = m.sysBuf[:], m.userBuf[:]
	m.run = m.process
}

// Scheduling states of a mailbox.
const (
	mailboxIdle int32 = iota
	mailboxRunning
)

type mailbox struct {
	mu        sync.Mutex
	sys, user ring
	suspended bool // under mu; set and cleared by system messages
	// status is mailboxRunning while a goroutine runs the mailbox.
	status     atomic.Int32
	invoker    actor.MessageInvoker
	dispatcher actor.Dispatcher
	// run is process, made once: a method value handed to the dispatcher
	// is a new closure each time.
	run  func()
	late *lateRequests
	// The queues start in these, so that an actor's few messages at a time
	// need no array of their own.
	sysBuf  [2]any
	userBuf [2]any
}

func (m *mailbox) PostUserMessage(msg any) {
	m.mu.Lock()
	m.user.push(msg)
	m.mu.Unlock()
	m.schedule()
}

func (m *mailbox) PostSystemMessage(msg any) {
	m.mu.Lock()
	m.sys.push(msg)
	m.mu.Unlock()
	m.schedule()
}

func (m *mailbox) RegisterHandlers(invoker actor.MessageInvoker, dispatcher actor.Dispatcher) {
	m.invoker, m.dispatcher = invoker, dispatcher
}

func (m *mailbox) Start() {}

func (m *mailbox) UserMessageCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.user.n
}

func (m *mailbox) schedule() {
	if m.status.CompareAndSwap(mailboxIdle, mailboxRunning) {
		m.dispatcher.Schedule(m.run)
	}
}

// process runs the mailbox until it finds nothing to run, which lets it go
// idle. A message posted before that is run here (its poster found the
// mailbox running); one posted after schedules the mailbox again.
func (m *mailbox) process() {
	for !m.drain() {
	}
}

// next takes the next message to run: a system one first; a user one
// only while not suspended; sys tells which. With none (ok false), it lets
// the mailbox go idle, under the lock posters queue under.
func (m *mailbox) next() (msg any, sys, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if msg, ok := m.sys.pop(); ok {
		switch msg.(type) {
		case *actor.SuspendMailbox:
			m.suspended = true
		case *actor.ResumeMailbox:
			m.suspended = false
		}
		return msg, true, true
	}
	if !m.suspended {
		if msg, ok := m.user.pop(); ok {
			return msg, false, true
		}
	}
	m.status.Store(mailboxIdle)
	return nil, false, false
}

// drain runs messages until next finds none (idle reports that). A panic
// in the actor ends it early, escalated to the actor's supervisor with the
// message, as protoactor's mailbox does.
func (m *mailbox) drain() (idle bool) {
	var msg any
	defer func() {
		if r := recover(); r != nil {
			m.invoker.EscalateFailure(r, msg)
		}
	}()
	for {
		var sys, ok bool
		msg, sys, ok = m.next()
		switch {
		case !ok:
			return true
		case !sys:
			m.invoker.InvokeUserMessage(msg)
			if m.late != nil {
				m.late.MessageReceived(msg)
			}
		default:
			switch msg.(type) {
			case *actor.SuspendMailbox, *actor.ResumeMailbox:
			default:
				m.invoker.InvokeSystemMessage(msg)
			}
		}
	}
}

// ring is a FIFO queue of messages that grows by doubling.
type ring struct {
	buf     []any
	head, n int
}

func (r *ring) push(v any) {
	if r.n == len(r.buf) {
		buf := make([]any, max(2*len(r.buf), 2))
		k := copy(buf, r.buf[r.head:])
		copy(buf[k:r.n], r.buf[:r.head])
		r.buf, r.head = buf, 0
	}
	r.buf[(r.head+r.n)%len(r.buf)] = v
	r.n++
}

func (r *ring) pop() (any, bool) {
	if r.n == 0 {
		return nil, false
	}
	v := r.buf[r.head]
	r.buf[r.head] = nil
	r.head = (r.head + 1) % len(r.buf)
	r.n--
	return v, true
}
