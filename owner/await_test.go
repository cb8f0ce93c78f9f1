package owner

import (
	"context"
	"errors"
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/sched"
)

// TestAwaitReadyOrder: when more than one thing is ready at once, await
// takes the answer over the close and the context, and the close over the
// context, every time (select would pick at random, and a deterministic
// run would then depend on it).
func TestAwaitReadyOrder(t *testing.T) {
	closed := make(chan struct{})
	close(closed)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	pid := &actor.PID{Id: "x"}
	for i := range 64 {
		o := &client{closed: closed, rt: sched.Real{}}
		reply := make(messages.ReplyTo, 1)
		reply <- "answer"
		if v, err := o.await(done, pid, reply); v != "answer" || err != nil {
			t.Fatalf("try %d: answer, close and context all ready: await = %v, %v; want the answer", i, v, err)
		}
		if _, err := o.await(done, pid, make(messages.ReplyTo, 1)); !errors.Is(err, ErrClosed) {
			t.Fatalf("try %d: close and context ready: await = %v, want ErrClosed", i, err)
		}
	}
}
