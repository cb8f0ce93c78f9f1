package owner_test

// Requests racing an end of the same session used to reach the session
// actor after its poison pill and be dropped by protoactor without a reply,
// so the asker waited out its whole timeout (a minute, or an hour without a
// deadline). Found while benchmarking. A forgotten actor now lives
// on for supervisor.ForgetGrace answering as ended, and a request queued
// behind its stop gets what a dead letter gets.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
)

func TestRequestsRacingAnEndSeeNoSessionSandbox(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	ctx := context.Background()
	noop := func(context.Context, provider.Provider, sandbox.Sandbox) error { return nil }
	for i := 0; i < 100; i++ {
		sid := fmt.Sprintf("s%d", i)
		seed(t, o, sid)
		var wg sync.WaitGroup
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < 8; j++ {
					if err := o.Do(ctx, sid, noop); err != nil && !errors.Is(err, sandbox.ErrNone) {
						t.Errorf("do: %v", err)
					}
					_, _ = o.RequireSessionSandbox(context.Background(), sid)
					if err := o.EndSessionSandbox(ctx, sid); err != nil {
						t.Errorf("end: %v", err)
					}
				}
			}()
		}
		wg.Wait()
	}
}
