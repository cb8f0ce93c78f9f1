package app_test

import (
	"context"
	"net"
	"testing"

	logtest "github.com/sirupsen/logrus/hooks/test"
	"go.uber.org/goleak"

	"github.com/sandboxowner/owner/app"
	"github.com/sandboxowner/owner/provider/fake"
)

// TestStartFailureAndStopLeaveNoGoroutine: a start that fails after the
// HTTP server is built (its port is taken) and a start followed by a stop
// leave no goroutine behind, lease ticker and reaper included.
func TestStartFailureAndStopLeaveNoGoroutine(t *testing.T) {
	ctx := context.Background()
	config := func() app.Config {
		cfg := app.Defaults()
		cfg.Host, cfg.Port = "127.0.0.1", 0
		cfg.SessionSecret = "a-secret-of-sixteen-plus"
		cfg.Checkpoint.Enabled = true
		cfg.Checkpoint.StateDir = t.TempDir()
		cfg.Checkpoint.ControlAuthToken = "tok"
		return cfg
	}
	deps := func() app.Deps {
		lg, _ := logtest.NewNullLogger()
		return app.Deps{Logger: lg, Provider: fake.New(fake.Options{})}
	}
	// A first start and stop lets process-wide goroutines (fasthttp's
	// clock) begin before the baseline is taken.
	warm, err := app.Start(ctx, config(), deps())
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	before := goleak.IgnoreCurrent()
	// fasthttp's idle-worker cleaner sees its server's stop only after
	// sleeping out its period (10 s): it ends on its own, not ours to end.
	cleaner := goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2")

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg := config()
	cfg.Port = taken.Addr().(*net.TCPAddr).Port
	if a, err := app.Start(ctx, cfg, deps()); err == nil {
		_ = a.Stop(ctx)
		t.Fatal("a start on a taken port succeeded")
	}
	goleak.VerifyNone(t, before, cleaner)

	a, err := app.Start(ctx, config(), deps())
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t, before, cleaner)
}
