package actors

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/go-cmp/cmp"
)

// heldRuns is a dispatcher that keeps the runs it is given for the test
// to run.
type heldRuns struct{ runs []func() }

func (d *heldRuns) Schedule(fn func()) { d.runs = append(d.runs, fn) }
func (d *heldRuns) Throughput() int    { return 300 }

// runAll runs the runs held, and those they schedule, in order.
func (d *heldRuns) runAll() {
	for len(d.runs) > 0 {
		fn := d.runs[0]
		d.runs = d.runs[1:]
		fn()
	}
}

// invocations records what a mailbox invokes; onUser, when set, runs on
// each user message (to post from inside a run, or to panic).
type invocations struct {
	got    []string
	onUser func(msg any)
}

func (v *invocations) InvokeSystemMessage(msg any) { v.got = append(v.got, fmt.Sprint("sys ", msg)) }
func (v *invocations) InvokeUserMessage(msg any) {
	v.got = append(v.got, fmt.Sprint("user ", msg))
	if v.onUser != nil {
		v.onUser(msg)
	}
}

func (v *invocations) EscalateFailure(reason, msg any) {
	v.got = append(v.got, fmt.Sprint("escalated ", reason, " on ", msg))
}

func newTestMailbox() (*mailbox, *heldRuns, *invocations) {
	m := Mailbox()().(*mailbox)
	d, v := &heldRuns{}, &invocations{}
	m.RegisterHandlers(v, d)
	m.Start()
	return m, d, v
}

func checkInvoked(t *testing.T, v *invocations, want ...string) {
	t.Helper()
	if diff := cmp.Diff(want, v.got); diff != "" {
		t.Errorf("invoked (-want +got):\n%s", diff)
	}
	v.got = nil
}

// TestMailboxRunsSystemMessagesFirstInOrder: messages posted to an idle
// mailbox schedule it once; its run takes the system messages first, then
// the user ones, each kind in the order posted, and leaves the mailbox
// idle, so that the next post schedules it again.
func TestMailboxRunsSystemMessagesFirstInOrder(t *testing.T) {
	m, d, v := newTestMailbox()
	for i := range 5 {
		m.PostUserMessage(fmt.Sprint("u", i))
	}
	m.PostSystemMessage("s0")
	m.PostSystemMessage("s1")
	m.PostSystemMessage("s2")
	if len(d.runs) != 1 || m.UserMessageCount() != 5 {
		t.Fatalf("%d runs scheduled, %d user messages queued; want 1 and 5", len(d.runs), m.UserMessageCount())
	}
	d.runAll()
	checkInvoked(t, v, "sys s0", "sys s1", "sys s2", "user u0", "user u1", "user u2", "user u3", "user u4")
	if m.UserMessageCount() != 0 {
		t.Errorf("%d user messages left queued", m.UserMessageCount())
	}
	m.PostUserMessage("again")
	if len(d.runs) != 1 {
		t.Fatalf("a post to the idle mailbox scheduled %d runs, want 1", len(d.runs))
	}
	d.runAll()
	checkInvoked(t, v, "user again")
}

// TestMailboxRunsWhatIsPostedDuringItsRun: a message posted while the
// mailbox runs (here by the actor itself) schedules nothing and is run by
// the run under way.
func TestMailboxRunsWhatIsPostedDuringItsRun(t *testing.T) {
	m, d, v := newTestMailbox()
	v.onUser = func(msg any) {
		if msg == "first" {
			m.PostUserMessage("second")
			m.PostSystemMessage("sys")
		}
	}
	m.PostUserMessage("first")
	d.runAll()
	checkInvoked(t, v, "user first", "sys sys", "user second")
	m.PostUserMessage("third")
	d.runAll()
	checkInvoked(t, v, "user third")
}

// TestMailboxSuspendedRunsOnlySystemMessages: between a SuspendMailbox
// and a ResumeMailbox only system messages run; user messages wait,
// posting one schedules a run that runs nothing, and the resume runs them.
// Neither message reaches the actor.
func TestMailboxSuspendedRunsOnlySystemMessages(t *testing.T) {
	m, d, v := newTestMailbox()
	m.PostSystemMessage(&actor.SuspendMailbox{})
	m.PostUserMessage("u0")
	m.PostSystemMessage("s0")
	d.runAll()
	checkInvoked(t, v, "sys s0")
	m.PostUserMessage("u1")
	if len(d.runs) != 1 {
		t.Fatalf("a post to the suspended idle mailbox scheduled %d runs, want 1", len(d.runs))
	}
	d.runAll()
	checkInvoked(t, v)
	m.PostSystemMessage(&actor.ResumeMailbox{})
	d.runAll()
	checkInvoked(t, v, "user u0", "user u1")
	if m.UserMessageCount() != 0 {
		t.Errorf("%d user messages left queued", m.UserMessageCount())
	}
}

// TestMailboxEscalatesAPanicAndGoesOn: a message whose handling panics is
// escalated with the panic's value, and the run goes on with the next
// message; a mailbox without late requests tells none.
func TestMailboxEscalatesAPanicAndGoesOn(t *testing.T) {
	m, d, v := newTestMailbox()
	v.onUser = func(msg any) {
		if msg == "boom" {
			panic("bad")
		}
	}
	m.PostUserMessage("boom")
	m.PostUserMessage("after")
	d.runAll()
	checkInvoked(t, v, "user boom", "escalated bad on boom", "user after")
	m.PostUserMessage("later")
	d.runAll()
	checkInvoked(t, v, "user later")
}

// TestRingIsFIFO: the queue gives back what was pushed in order, across
// its growth and its wrapping around, against a slice doing the same.
func TestRingIsFIFO(t *testing.T) {
	var r ring
	var want []int
	rnd := rand.New(rand.NewPCG(1, 2))
	next := 0
	for range 2000 {
		if rnd.IntN(5) < 3 {
			r.push(next)
			want = append(want, next)
			next++
			continue
		}
		got, ok := r.pop()
		if len(want) == 0 {
			if ok {
				t.Fatalf("pop of an empty ring gave %v", got)
			}
			continue
		}
		if !ok || got != want[0] {
			t.Fatalf("pop: %v %v, want %d", got, ok, want[0])
		}
		want = want[1:]
	}
	if r.n != len(want) {
		t.Fatalf("ring holds %d, want %d", r.n, len(want))
	}
	for _, w := range want {
		if got, ok := r.pop(); !ok || got != w {
			t.Fatalf("draining: %v %v, want %d", got, ok, w)
		}
	}
	if r.n != 0 || r.head >= len(r.buf) {
		t.Errorf("drained ring: n %d head %d of %d", r.n, r.head, len(r.buf))
	}
}
