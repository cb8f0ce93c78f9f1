package swebench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local"
	"github.com/sandboxowner/owner/provider/local/localtest"
	"github.com/sandboxowner/owner/sandbox"
)

// newGolden is the golden-patch instance: its owner has no provider (with
// checkpointing on, no state_dir and 8 workers, the mode in effect is
// restart_only) and grading runs on a local provider of its own.
func newGolden(t *testing.T, tk task, opts ...func(*Config, *provider.Provider)) (*local.Provider, *owner.Owner, *Server) {
	t.Helper()
	return newGoldenOn(t, tk, local.Options{}, opts...)
}

// newGoldenOn is newGolden with its local provider on lopts (its root and
// logger are the test's).
func newGoldenOn(t *testing.T, tk task, lopts local.Options, opts ...func(*Config, *provider.Provider)) (*local.Provider, *owner.Owner, *Server) {
	t.Helper()
	needTools(t, "git", "go", "patch")
	log := testLogger(t)
	lopts.Root, lopts.Logger = t.TempDir(), log
	if lopts.InitBinary == "" {
		lopts.InitBinary = localtest.InitBinary(t)
	}
	prov, err := local.New(lopts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prov.Close() }) // its directories made ahead go before the temporary root
	cfg := Config{
		IsVerifyingGoldenPatch: true,
		Repos:                  map[string]string{taskRepo: tk.dir},
		TemplateDir:            testTemplatesDir(),
		StdCacheDir:            testStdCacheDir(),
		TestCommands:           map[string]string{taskRepo: goTestCmd},
	}
	grader := provider.Provider(prov)
	for _, o := range opts {
		o(&cfg, &grader)
	}
	if cfg.LendsSandboxes() {
		t.Fatal("the golden-patch instance lends sandboxes")
	}
	own, err := owner.New(context.Background(), owner.Config{
		Name: "swebench_golden", Logger: log, NumWorkers: 8,
		Checkpoint: owner.CheckpointConfig{Enabled: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = own.Close() })
	if own.Mode() != owner.ModeRestartOnly {
		t.Fatalf("mode %s, want restart_only", own.Mode())
	}
	srv, err := New(cfg, Deps{Name: "swebench_golden", Grader: grader, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	return prov, own, srv
}

func TestGoldenPatchInstanceResolvesAndLendsNothing(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	prov, own, srv := newGolden(t, tk)
	for _, format := range []string{"original", "multilingual"} {
		t.Run(format, func(t *testing.T) {
			row := tk.row("example__calc-1")
			if format == "multilingual" {
				row = tk.multilingualRow("example__calc-1")
			}
			sid := "golden-" + format
			seed, err := srv.SeedSession(context.Background(), own, sid, mustJSON(t, row))
			if err != nil {
				t.Fatal(err)
			}
			if seed.SandboxHandle != nil {
				t.Errorf("the golden seed lent sandbox %s", *seed.SandboxHandle)
			}
			if _, err := own.RequireSessionSandbox(context.Background(), sid); !errors.Is(err, sandbox.ErrNone) {
				t.Errorf("RequireSessionSandbox = %v, want sandbox.ErrNone (so /sandbox_access is 404)", err)
			}
			res, err := srv.VerifySession(context.Background(), own, sid, mustJSON(t, row))
			if err != nil {
				t.Fatal(err)
			}
			wantResolved(t, res)
			if res.PatchSource != PatchSourceGolden || *res.ModelPatch != tk.patch {
				t.Errorf("graded %q from %q, want the row's patch", *res.ModelPatch, res.PatchSource)
			}
			if live, _ := prov.ListSandboxes(context.Background()); len(live) != 0 {
				t.Errorf("sandboxes left running: %v", live)
			}
		})
	}
	// A row without its patch cannot be graded by the golden instance.
	row := tk.row("example__calc-2")
	row["patch"] = ""
	if _, err := srv.SeedSession(context.Background(), own, "golden-nopatch", mustJSON(t, row)); !errors.Is(err, ErrInvalidRow) {
		t.Errorf("seed of a row without patch: %v, want ErrInvalidRow", err)
	}
}

// failingStart is a provider whose Start fails.
type failingStart struct{ provider.Provider }

func (failingStart) Start(context.Context, provider.Spec) (provider.Handle, error) {
	return provider.Handle{}, errors.New("no capacity")
}

// evalTimeoutOnCue is a grading provider whose commands time out on a
// manual clock (its local provider's ExecClock): it runs the eval script,
// waits until the script has written its output and signalled through the
// FIFO evalStarted, then moves the clock past the evaluation timeout. So
// the eval times out after its output, however slow the machine (the
// script's cue comes after the grader's filter forwarded that output:
// timeoutEvalScript).
type evalTimeoutOnCue struct {
	provider.Provider
	clk *clock.Manual
	t   *testing.T
}

// evalStarted is the FIFO, relative to the workdir, that the eval script
// of the timeout case writes to once it has printed its output.
const evalStarted = scratchDir + "/started"

func (e evalTimeoutOnCue) Exec(ctx context.Context, h provider.Handle, req provider.ExecRequest) (provider.ExecResult, error) {
	if !strings.Contains(req.Command, "eval.sh") {
		return e.Provider.Exec(ctx, h, req)
	}
	if req.Timeout != time.Second {
		e.t.Errorf("the eval ran with a timeout of %s, want evaluation_timeout's 1s", req.Timeout)
	}
	if res, err := e.Provider.Exec(ctx, h, provider.ExecRequest{Command: "mkfifo " + evalStarted, Timeout: time.Minute}); err != nil || res.ExitCode != 0 {
		return res, fmt.Errorf("mkfifo: %+v %v", res, err)
	}
	type result struct {
		res provider.ExecResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := e.Provider.Exec(ctx, h, req)
		done <- result{res, err}
	}()
	// Blocks until the script opens the FIFO to write, after its output.
	// Its context bounds a broken test on the wall clock (the timeout's
	// clock is the manual one); it is not a synchronisation.
	wait, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if res, err := e.Provider.Exec(wait, h, provider.ExecRequest{Command: "cat " + evalStarted, Timeout: time.Minute}); err != nil || res.ExitCode != 0 {
		e.t.Errorf("waiting for the eval script: %+v %v", res, err)
	}
	// The eval's timer is the one left armed; the clock passes it.
	e.clk.WaitPending(1, ctx.Done())
	e.clk.Advance(time.Second)
	r := <-done
	return r.res, r.err
}

// timeoutEvalScript prints its output, then gives evalTimeoutOnCue its cue
// and sleeps. Its output reaches the grader through the eval's filter, an
// awk on the other end of a pipe, which the timeout kills with the script:
// a cue given right after the echo left the output in the pipe, or awk not
// yet started, when the kill came under load (an empty test_output). So
// 256 KiB follow it before the cue: a pipe holds 64 KiB, so the writes
// return only once awk has read (and so printed and flushed) at least
// 192 KiB, the lines before them first.
const timeoutEvalScript = "#!/bin/bash\necho '>>>>> Start Test Output'\necho started\n" +
	"for i in $(seq 256); do printf '%01023d\\n' \"$i\"; done\n" +
	"echo > " + evalStarted + "\nsleep 120\n"

func TestGradingFailuresAreReportedAndLeaveNothingRunning(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	evalClk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cases := []struct {
		name      string
		opt       func(*Config, *provider.Provider)
		execClock clock.Clock
		row       func(map[string]any)
		kind      string
		masked    bool
		output    string
	}{
		{"a patch that does not apply", nil, nil, func(r map[string]any) {
			r["patch"] = "diff --git a/calc.go b/calc.go\n--- a/calc.go\n+++ b/calc.go\n@@ -1,3 +1,3 @@\n-nothing like this\n+line\n context\n"
		}, FailurePatchApply, false, "patch --batch --fuzz=5"},
		{"an eval script past evaluation_timeout", func(c *Config, p *provider.Provider) {
			c.EvaluationTimeout, c.Validate = 1, off()
			*p = evalTimeoutOnCue{Provider: *p, clk: evalClk, t: t}
		}, evalClk, func(r map[string]any) {
			r["eval_script"] = timeoutEvalScript
		}, FailureEvalTimeout, false, "started"},
		{"a grading sandbox that cannot start", func(_ *Config, p *provider.Provider) { *p = failingStart{*p} }, nil, nil, FailureGrading, true, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var opts []func(*Config, *provider.Provider)
			if c.opt != nil {
				opts = append(opts, c.opt)
			}
			prov, own, srv := newGoldenOn(t, tk, local.Options{ExecClock: c.execClock}, opts...)
			row := tk.row("example__calc-1")
			if c.row != nil {
				c.row(row)
			}
			if _, err := srv.SeedSession(context.Background(), own, "s", mustJSON(t, row)); err != nil {
				t.Fatal(err)
			}
			res, err := srv.VerifySession(context.Background(), own, "s", mustJSON(t, row))
			if err != nil {
				t.Fatal(err)
			}
			if res.Reward != 0 || res.EvaluationCompleted || res.FailureKind != c.kind || res.MaskSample != c.masked || !strings.Contains(res.TestOutput, c.output) {
				t.Errorf("reply:\n%s", describe(res))
			}
			if live, _ := prov.ListSandboxes(context.Background()); len(live) != 0 {
				t.Errorf("sandboxes left running: %v", live)
			}
		})
	}
}
