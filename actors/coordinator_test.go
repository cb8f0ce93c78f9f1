package actors_test

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/sched"
)

var roundStart = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)

// answer is how a stand-in session answers TakeSnapshot: after a delay on
// the scheduler's clock, or never.
type answer struct {
	after time.Duration
	never bool
	err   error
}

// stubSession answers the coordinator as a session actor would.
type stubSession struct {
	id  string
	ans answer
	det *sched.Det
}

func (s *stubSession) Receive(ctx actor.Context) {
	m, ok := ctx.Message().(*messages.TakeSnapshot)
	if !ok || s.ans.never {
		return
	}
	to, root := ctx.Sender(), ctx.ActorSystem().Root
	reply := &messages.SnapshotReply{Round: m.Round, SessionID: s.id, Err: s.ans.err}
	if s.ans.err == nil {
		reply.SnapshotID = "snap-" + s.id
	}
	s.det.AfterFunc(s.ans.after, func() { root.Send(to, reply) })
}

// coordination is a coordinator and stand-in sessions on one deterministic
// scheduler: mailboxes, timers and the round's deadline all on its clock.
type coordination struct {
	det     *sched.Det
	sys     *actor.ActorSystem
	coord   *actor.PID
	refs    []messages.SessionRef
	orphans []string
}

func newCoordination(t *testing.T, answers map[string]answer) *coordination {
	t.Helper()
	c := &coordination{det: sched.NewDet(1, roundStart)}
	t.Cleanup(c.det.Close)
	c.sys = actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
	on := actor.WithDispatcher(c.det)
	c.coord = c.sys.Root.Spawn(actors.CoordinatorProps(&actors.CoordinatorEnv{
		Log:   logs.Discard(),
		Clock: c.det,
	}).Configure(on))
	c.sys.EventStream.Subscribe(func(ev any) {
		if o, ok := ev.(*actors.OrphanSnapshot); ok && o.Coordinator.Equal(c.coord) {
			c.orphans = append(c.orphans, o.SessionID+":"+o.SnapshotID)
		}
	})
	for _, sid := range []string{"s0", "s1", "s2"} {
		a, ok := answers[sid]
		if !ok {
			continue
		}
		s := &stubSession{id: sid, ans: a, det: c.det}
		pid := c.sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return s }).Configure(on))
		c.refs = append(c.refs, messages.SessionRef{SessionID: sid, PID: pid})
	}
	c.det.Settle()
	return c
}

// round starts a round with the deadline d from now and runs the scheduler
// until the coordinator answers; it returns the result and when it came.
func (c *coordination) round(id uint64, d time.Duration) (*actors.RoundResult, time.Duration) {
	reply := make(messages.ReplyTo, 1)
	c.sys.Root.Send(c.coord, &actors.StartRound{ID: id, Sessions: c.refs, Deadline: c.det.Now().Add(d), Reply: reply})
	c.det.RunUntil(func() bool { return len(reply) > 0 })
	return (<-reply).(*actors.RoundResult), c.det.Now().Sub(roundStart)
}

func snapIDs(res *actors.RoundResult) []string {
	var out []string
	for _, t := range res.Taken {
		out = append(out, t.SnapshotID)
	}
	return out
}

func TestCoordinatorRoundOnTime(t *testing.T) {
	c := newCoordination(t, map[string]answer{"s0": {after: time.Second}, "s1": {after: 2 * time.Second}, "s2": {err: fmt.Errorf("boom")}})
	res, at := c.round(1, time.Minute)
	if at != 2*time.Second {
		t.Errorf("answered after %v, want at the last answer (2s)", at)
	}
	if diff := cmp.Diff([]string{"snap-s0", "snap-s1"}, snapIDs(res)); diff != "" {
		t.Errorf("taken (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]string{"s2": "boom"}, res.Failed); diff != "" {
		t.Errorf("failed (-want +got):\n%s", diff)
	}
	// The round's deadline was disarmed with it: nothing fires later.
	if n := c.det.Pending(); n != 0 {
		t.Errorf("%d timers still pending after the round", n)
	}
}

// A session that answers after the deadline but within the drain grace
// fails the round, and its late snapshot is in the result (for the commit
// to delete); the round answers as soon as it has it.
func TestCoordinatorDrainsALateSnapshot(t *testing.T) {
	c := newCoordination(t, map[string]answer{"s0": {after: time.Second}, "s1": {after: 10 * time.Second}})
	res, at := c.round(1, 5*time.Second)
	if at != 10*time.Second {
		t.Errorf("answered after %v, want when the late snapshot came (10s)", at)
	}
	if diff := cmp.Diff([]string{"snap-s0", "snap-s1"}, snapIDs(res)); diff != "" {
		t.Errorf("taken (-want +got):\n%s", diff)
	}
	if _, failed := res.Failed["s1"]; !failed || len(res.Failed) != 1 {
		t.Errorf("failed = %v, want s1 alone", res.Failed)
	}
	if len(c.orphans) != 0 {
		t.Errorf("orphans %v: a drained snapshot is the round's, not an orphan", c.orphans)
	}
}

// A session that never answers holds the round for the deadline plus the
// drain grace, no longer; what it delivers after that is an orphan.
func TestCoordinatorGivesUpAfterTheDrainGrace(t *testing.T) {
	c := newCoordination(t, map[string]answer{"s0": {after: time.Second}, "s1": {after: 5*time.Second + actors.DrainGrace + time.Second}})
	res, at := c.round(1, 5*time.Second)
	if want := 5*time.Second + actors.DrainGrace; at != want {
		t.Errorf("answered after %v, want at the deadline plus the drain grace (%v)", at, want)
	}
	if diff := cmp.Diff([]string{"snap-s0"}, snapIDs(res)); diff != "" {
		t.Errorf("taken (-want +got):\n%s", diff)
	}
	if _, failed := res.Failed["s1"]; !failed {
		t.Errorf("failed = %v, want s1", res.Failed)
	}
	c.det.RunUntil(func() bool { return len(c.orphans) > 0 })
	if diff := cmp.Diff([]string{"s1:snap-s1"}, c.orphans); diff != "" {
		t.Errorf("orphans (-want +got):\n%s", diff)
	}
}

// One round at a time: a second StartRound while one runs is answered
// Busy, to its own reply slot, and the first round is not disturbed.
func TestCoordinatorOneRoundAtATime(t *testing.T) {
	c := newCoordination(t, map[string]answer{"s0": {after: time.Second}})
	first, second := make(messages.ReplyTo, 1), make(messages.ReplyTo, 1)
	c.sys.Root.Send(c.coord, &actors.StartRound{ID: 1, Sessions: c.refs, Deadline: roundStart.Add(time.Minute), Reply: first})
	c.sys.Root.Send(c.coord, &actors.StartRound{ID: 2, Sessions: c.refs, Deadline: roundStart.Add(time.Minute), Reply: second})
	c.det.RunUntil(func() bool { return len(first) > 0 && len(second) > 0 })
	busy := (<-second).(*actors.RoundResult)
	done := (<-first).(*actors.RoundResult)
	if !busy.Busy || busy.Round != 2 {
		t.Errorf("second round: %+v, want Busy", busy)
	}
	if done.Busy || len(done.Taken) != 1 {
		t.Errorf("first round: %+v, want its snapshot", done)
	}
}
