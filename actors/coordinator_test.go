package actors

import (
	"errors"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/messages"
)

func refs(ids ...string) []messages.SessionRef {
	out := make([]messages.SessionRef, len(ids))
	for i, id := range ids {
		out[i] = messages.SessionRef{SessionID: id, PID: actor.NewPID("local", "pid-"+id)}
	}
	return out
}

func TestRoundCommitsOnlyWhenEverySessionSucceeded(t *testing.T) {
	r := NewRound(7, refs("a", "b", "c"))
	if r.Done() {
		t.Fatal("a round with sessions to ask is done")
	}
	steps := []struct {
		reply *messages.SnapshotReply
		taken bool
	}{
		{&messages.SnapshotReply{Round: 6, SessionID: "a", SnapshotID: "old"}, false}, // stale round
		{&messages.SnapshotReply{Round: 7, SessionID: "zz", SnapshotID: "x"}, false},  // not asked
		{&messages.SnapshotReply{Round: 7, SessionID: "a", SnapshotID: "snap-a"}, true},
		{&messages.SnapshotReply{Round: 7, SessionID: "a", SnapshotID: "dup"}, false}, // duplicate
		{&messages.SnapshotReply{Round: 7, SessionID: "b", Skipped: true}, true},
	}
	for i, s := range steps {
		if got := r.Reply(s.reply); got != s.taken {
			t.Fatalf("step %d: Reply = %v, want %v", i, got, s.taken)
		}
	}
	if r.Done() {
		t.Fatal("done while c has not answered")
	}
	r.Terminated("pid-c")
	if !r.Done() || r.OK() {
		t.Fatalf("after c terminated: done=%v ok=%v", r.Done(), r.OK())
	}
	res := r.Result()
	want := &RoundResult{
		Round:   7,
		Taken:   []messages.SnapshotReply{{Round: 7, SessionID: "a", SnapshotID: "snap-a"}},
		Skipped: []string{"b"},
		Failed:  map[string]string{"c": "session stopped during the checkpoint"},
	}
	if diff := cmp.Diff(want, res); diff != "" {
		t.Fatalf("result (-want +got):\n%s", diff)
	}
}

func TestRoundKeepsSnapshotsOfFailedRepliesAndTimesOut(t *testing.T) {
	r := NewRound(1, refs("a", "b"))
	r.Reply(&messages.SnapshotReply{Round: 1, SessionID: "a", SnapshotID: "snap-a", Err: errors.New("ready check failed")})
	r.Timeout()
	res := r.Result()
	if len(res.Taken) != 1 || res.Taken[0].SnapshotID != "snap-a" {
		t.Fatalf("the snapshot of a failed reply is not kept for cleanup: %+v", res.Taken)
	}
	if diff := cmp.Diff(map[string]string{"a": "ready check failed", "b": "no snapshot before the checkpoint's deadline"}, res.Failed); diff != "" {
		t.Fatalf("failed (-want +got):\n%s", diff)
	}
	if NewRound(2, nil).Done() != true {
		t.Fatal("an empty round is not done at once")
	}
}

func TestRoundAwaitsLateSessionsAfterItsDeadline(t *testing.T) {
	r := NewRound(3, refs("a", "b", "c"))
	r.Reply(&messages.SnapshotReply{Round: 3, SessionID: "a", SnapshotID: "snap-a"})
	r.Timeout()
	if r.Done() || !r.Draining() {
		t.Fatalf("after the deadline with b and c in flight: done=%v draining=%v", r.Done(), r.Draining())
	}
	// b's call was in flight at the deadline and took a snapshot after it:
	// the round reports it, so that the failed commit deletes it.
	if !r.Reply(&messages.SnapshotReply{Round: 3, SessionID: "b", SnapshotID: "snap-b-late"}) {
		t.Fatal("a late reply of a draining session was refused")
	}
	if r.Reply(&messages.SnapshotReply{Round: 3, SessionID: "b", SnapshotID: "dup"}) {
		t.Fatal("a second late reply was taken")
	}
	if r.Done() {
		t.Fatal("done while c may still deliver a snapshot")
	}
	r.Terminated("pid-c")
	if !r.Done() {
		t.Fatal("not done once every late session answered or stopped")
	}
	res := r.Result()
	var taken []string
	for _, s := range res.Taken {
		taken = append(taken, s.SnapshotID)
	}
	if diff := cmp.Diff([]string{"snap-a", "snap-b-late"}, taken); diff != "" {
		t.Fatalf("taken (-want +got):\n%s", diff)
	}
	want := map[string]string{"b": "no snapshot before the checkpoint's deadline", "c": "no snapshot before the checkpoint's deadline"}
	if diff := cmp.Diff(want, res.Failed); diff != "" {
		t.Fatalf("failed (-want +got):\n%s", diff)
	}
}

func TestRoundGivesUpOnLateSessions(t *testing.T) {
	r := NewRound(4, refs("a"))
	r.Timeout()
	r.GiveUp()
	if !r.Done() {
		t.Fatal("not done after giving up on every late session")
	}
	if r.Reply(&messages.SnapshotReply{Round: 4, SessionID: "a", SnapshotID: "orphan"}) {
		t.Fatal("a reply after giving up was taken: nobody would delete it")
	}
}
