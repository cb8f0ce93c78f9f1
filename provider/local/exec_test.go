package local

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/provider"

	"github.com/sandboxowner/owner/provider/local/sinit"
)

func TestExecOutputExitCodeEnvAndCwd(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		p := newProvider(t, m, Options{})
		h := start(t, p, provider.Spec{Env: map[string]string{"A": "spec", "B": "spec"}})
		ctx := context.Background()
		if err := p.WriteFile(ctx, h, "sub/dir/f.txt", []byte("in sub")); err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			name string
			req  provider.ExecRequest
			want provider.ExecResult
		}{
			{"stdout", provider.ExecRequest{Command: "echo hello"}, provider.ExecResult{Stdout: "hello\n"}},
			{"stderr and exit code", provider.ExecRequest{Command: "echo oops >&2; exit 3"}, provider.ExecResult{Stderr: "oops\n", ExitCode: 3}},
			{"exit code 255", provider.ExecRequest{Command: "exit 255"}, provider.ExecResult{ExitCode: 255}},
			{"killed by a signal", provider.ExecRequest{Command: "kill -TERM $$"}, provider.ExecResult{ExitCode: 128 + 15}},
			{"spec env, request env wins", provider.ExecRequest{Command: `echo "$A $B $C"`, Env: map[string]string{"B": "req", "C": "req"}},
				provider.ExecResult{Stdout: "spec req req\n"}},
			{"sandbox id in env", provider.ExecRequest{Command: `echo "$` + SandboxIDEnv + `"`}, provider.ExecResult{Stdout: h.SandboxID + "\n"}},
			{"the server's env is not leaked", provider.ExecRequest{Command: `echo "[$GOPATH$GOROOT$LOCAL_PROVIDER_TEST_HELPER]"`}, provider.ExecResult{Stdout: "[]\n"}},
			{"relative cwd", provider.ExecRequest{Command: "cat f.txt", Cwd: "sub/dir"}, provider.ExecResult{Stdout: "in sub"}},
			{"absolute cwd under the workdir", provider.ExecRequest{Command: "cat dir/f.txt", Cwd: DefaultWorkdir + "/sub"}, provider.ExecResult{Stdout: "in sub"}},
		}
		for _, c := range cases {
			got, err := p.Exec(ctx, h, c.req)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if d := cmp.Diff(c.want, got); d != "" {
				t.Errorf("%s (-want +got):\n%s", c.name, d)
			}
		}
		// A missing cwd is an error, not a result.
		_, err := p.Exec(ctx, h, provider.ExecRequest{Command: "true", Cwd: "nope"})
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("missing cwd: err = %v, want fs.ErrNotExist", err)
		}
	})
}

// A command its init cannot start (its cwd one the sandbox may not enter:
// every capability is dropped) is an error, not an exit of 0, and the init
// goes on starting the next.
func TestExecACommandThatCannotStartIsAnError(t *testing.T) {
	t.Parallel()
	p := newProvider(t, mode{"container-copy", IsolationContainer, OverlayOff}, Options{})
	h := start(t, p, provider.Spec{})
	mustRun(t, p, h, "mkdir shut && chmod 000 shut")
	res, err := p.Exec(context.Background(), h, provider.ExecRequest{Command: "true", Cwd: "shut"})
	if err == nil || !strings.Contains(err.Error(), "start the command") || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("a cwd the sandbox may not enter: %+v, %v; want the start's error", res, err)
	}
	if got := mustRun(t, p, h, "echo next"); got != "next\n" {
		t.Errorf("the next command: %q", got)
	}
}

// t0 is when the manual clocks of these tests start.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// execResult is what an Exec run in the background returned.
type execResult struct {
	res provider.ExecResult
	err error
}

// execOnManualClock runs req in the background on p, whose ExecClock is
// clk, waits until the command signalled (through a
// FIFO "ready" it writes to; none when ready is false) and its timeout timer
// is armed, and returns the clock and the channel the result arrives on.
// The command's timeout then passes only when the test advances the clock,
// however slow the machine.
func execOnManualClock(t *testing.T, p *Provider, clk *clock.Manual, h provider.Handle, req provider.ExecRequest, ready bool) <-chan execResult {
	t.Helper()
	var wait func()
	if ready {
		wait = mkfifo(t, p, h, "ready")
	}
	done := make(chan execResult, 1)
	returned := make(chan struct{})
	go func() {
		res, err := p.Exec(context.Background(), h, req)
		done <- execResult{res, err}
		close(returned)
	}()
	if wait != nil {
		wait()
	}
	if !clk.WaitPending(1, returned) {
		r := <-done
		t.Fatalf("Exec returned before its timeout was armed: %+v, %v", r.res, r.err)
	}
	return done
}

func TestExecTimeoutKillsTheProcessTree(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		clk := clock.NewManual(t0)
		p := newProvider(t, m, Options{ExecClock: clk})
		h := start(t, p, provider.Spec{})
		// Children in the background and in a subshell: all must die.
		done := execOnManualClock(t, p, clk, h, provider.ExecRequest{
			Command: "sleep 600 & (sleep 601; echo never) & echo started; echo > ready; wait",
			Timeout: 300 * time.Millisecond,
		}, true)
		if at, _ := clk.Next(); !at.Equal(t0.Add(300 * time.Millisecond)) {
			t.Errorf("the timeout is due at +%s, want +300ms", at.Sub(t0))
		}
		clk.Advance(300 * time.Millisecond)
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		if d := cmp.Diff(provider.ExecResult{Stdout: "started\n", ExitCode: 137, TimedOut: true}, r.res); d != "" {
			t.Errorf("result (-want +got):\n%s", d)
		}
		if pids := commandPids(p, h.SandboxID); len(pids) != 0 {
			t.Errorf("processes of the command still alive after the timeout: %v", pids)
		}
	})
}

func TestExecDefaultTimeout(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(t0)
	p := newProvider(t, mode{"none-copy", IsolationNone, OverlayOff}, Options{DefaultExecTimeout: 200 * time.Millisecond, ExecClock: clk})
	h := start(t, p, provider.Spec{})
	done := execOnManualClock(t, p, clk, h, provider.ExecRequest{Command: "sleep 600"}, false)
	if at, _ := clk.Next(); !at.Equal(t0.Add(200 * time.Millisecond)) {
		t.Errorf("the timeout is due at +%s, want the default's +200ms", at.Sub(t0))
	}
	clk.Advance(200 * time.Millisecond)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !r.res.TimedOut || r.res.ExitCode != 137 {
		t.Errorf("got %+v, want a timeout by the default", r.res)
	}
}

// A sandbox is a container: what a command leaves running in the
// background (in its process group or out of it) keeps running, and
// another command sees it, until the sandbox stops, which kills every
// process of it. Every exec used to be its own pid namespace, so a
// background process died when the command that started it ended.
func TestBackgroundProcessesLiveUntilTheSandboxStops(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		p := newProvider(t, m, Options{})
		h := start(t, p, provider.Spec{})
		// The background sleeps keep stdout open; Exec must not wait.
		res := run(t, p, h, "sleep 600 & echo $! > bg; setsid sleep 601 & echo bg")
		if res.Stdout != "bg\n" || res.ExitCode != 0 || res.TimedOut {
			t.Errorf("got %+v", res)
		}
		if pids := waitCommandPids(p, h.SandboxID, 2); len(pids) != 2 {
			t.Errorf("the background processes: %v, want 2", pids)
		}
		if got := mustRun(t, p, h, `kill -0 "$(cat bg)" && echo alive`); got != "alive\n" {
			t.Errorf("the next command does not see the background one: %q", got)
		}
		if err := p.Stop(context.Background(), h); err != nil {
			t.Fatal(err)
		}
		if pids := markedProcesses(h.SandboxID); len(pids) != 0 {
			t.Errorf("processes of the sandbox outlived its stop: %v", pids)
		}
	})
}

func TestExecContextCancelKills(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		p := newProvider(t, m, Options{})
		h := start(t, p, provider.Spec{})
		ctx, cancel := context.WithCancel(context.Background())
		done := execRunning(t, ctx, p, h, "sleep 600; echo not reached")
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if pids := commandPids(p, h.SandboxID); len(pids) != 0 {
			t.Errorf("processes alive after cancel: %v", pids)
		}
		// A context already done runs nothing.
		if _, err := p.Exec(ctx, h, provider.ExecRequest{Command: "touch ran"}); !errors.Is(err, context.Canceled) {
			t.Errorf("done ctx: err = %v", err)
		}
		if _, err := p.ReadFile(context.Background(), h, "ran"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a command ran on a done context: %v", err)
		}
	})
}

func TestExecOutputCap(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		p := newProvider(t, m, Options{OutputCap: 1000})
		h := start(t, p, provider.Spec{})
		res := run(t, p, h, "head -c 5000 /dev/zero | tr '\\0' o; head -c 3000 /dev/zero | tr '\\0' e >&2; exit 4")
		want := provider.ExecResult{Stdout: strings.Repeat("o", 1000), Stderr: strings.Repeat("e", 1000), ExitCode: 4, Truncated: true}
		if d := cmp.Diff(want, res); d != "" {
			t.Errorf("over the cap (-want +got):\n%s", d)
		}
		res = run(t, p, h, "head -c 1000 /dev/zero | tr '\\0' o")
		if len(res.Stdout) != 1000 || res.Truncated {
			t.Errorf("exactly the cap: len %d, truncated %v; want 1000, false", len(res.Stdout), res.Truncated)
		}
	})
}

func TestExecBadRequests(t *testing.T) {
	t.Parallel()
	p := newProvider(t, mode{"none-copy", IsolationNone, OverlayOff}, Options{})
	h := start(t, p, provider.Spec{})
	ctx := context.Background()
	cases := []struct {
		name string
		req  provider.ExecRequest
		want error
	}{
		{"cwd ..", provider.ExecRequest{Command: "true", Cwd: ".."}, provider.ErrPathEscape},
		{"cwd absolute outside", provider.ExecRequest{Command: "true", Cwd: "/etc"}, provider.ErrPathEscape},
		{"env key with =", provider.ExecRequest{Command: "true", Env: map[string]string{"A=B": "x"}}, provider.ErrInvalidSpec},
		{"negative timeout", provider.ExecRequest{Command: "true", Timeout: -time.Second}, provider.ErrInvalidSpec},
	}
	for _, c := range cases {
		if _, err := p.Exec(ctx, h, c.req); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := p.Exec(ctx, provider.Handle{SandboxID: "sb-0000000000000000"}, provider.ExecRequest{Command: "true"}); !errors.Is(err, provider.ErrSandboxNotFound) {
		t.Errorf("unknown sandbox: %v", err)
	}
	if _, err := p.Exec(ctx, provider.Handle{SandboxID: "../../etc"}, provider.ExecRequest{Command: "true"}); !errors.Is(err, provider.ErrSandboxNotFound) {
		t.Errorf("malformed id: %v", err)
	}
}

// A command's output went to a file in memory that any process of the
// sandbox could reopen through /proc/<pid>/fd/1: truncated and rewritten
// there, it was what the server read back, whatever the command had
// printed (a grader reading test results from it read the forgery). The
// output now reaches the server through pipes: what was written stays
// written, and an isolated sandbox cannot reopen them at all (their
// inodes are the server's, 0600), to read what the server has not yet
// read, nor to write.
func TestACommandCannotRewriteOrReadItsCapturedOutput(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		p := newProvider(t, m, Options{})
		h := start(t, p, provider.Spec{})
		res := run(t, p, h, `echo real; echo err >&2
( exec 9>&2 2>/dev/null; echo forged > /proc/self/fd/1; echo forged > /proc/self/fd/9 )
( exec 2>/dev/null; exec 3</proc/self/fd/1 && echo readable )
true`)
		want := provider.ExecResult{Stdout: "real\n", Stderr: "err\n"}
		if m.isolation == IsolationNone {
			// Unisolated commands run as the server's uid: they may
			// reopen, but only add to what was written.
			want = provider.ExecResult{Stdout: "real\nforged\nreadable\n", Stderr: "err\nforged\n"}
		}
		if d := cmp.Diff(want, res); d != "" {
			t.Errorf("result (-want +got):\n%s", d)
		}
	})
}

// What a command leaves running may write more than a pipe holds after the
// command returned: the server drains it (keeping none of it), so the
// writer never blocks.
func TestOutputAfterTheCommandReturnedIsDrained(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		p := newProvider(t, m, Options{})
		h := start(t, p, provider.Spec{})
		mustRun(t, p, h, "mkfifo go finished")
		res := run(t, p, h, "{ read x < go; head -c 4000000 /dev/zero; echo wrote > finished; } & echo started")
		if d := cmp.Diff(provider.ExecResult{Stdout: "started\n"}, res); d != "" {
			t.Errorf("result (-want +got):\n%s", d)
		}
		// Were the 4 MB not drained, cat would wait for the timeout.
		res = run(t, p, h, "echo > go; cat finished")
		if d := cmp.Diff(provider.ExecResult{Stdout: "wrote\n"}, res); d != "" {
			t.Errorf("the background writer (-want +got):\n%s", d)
		}
	})
}

// An init that took its setup and never answers holds its start only as
// long as the start's context: the wait ends with it, and the init finds
// its end of the control socket closed.
func TestAnInitsSetupWaitEndsWithItsContext(t *testing.T) {
	t.Parallel()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- awaitSetup(ctx, fds[0], &sinit.Setup{}) }()
	buf := make([]byte, 64<<10)
	if n, _, _, _, err := unix.Recvmsg(fds[1], buf, nil, 0); err != nil || n == 0 {
		t.Fatalf("the setup: %d bytes, %v", n, err)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("a setup never answered, its context cancelled: %v, want context.Canceled", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("a setup never answered is still awaited after its context was cancelled")
	}
	if n, _, _, _, err := unix.Recvmsg(fds[1], buf, nil, 0); n != 0 || err != nil {
		t.Errorf("the init's end after the wait ended: %d bytes, %v; want the end (0, nil)", n, err)
	}
}

// An init whose cgroup is frozen (a snapshot's freeze never thawed, a
// crashed server's) never answers the kill an exec's ended context asks
// for: the exec returns with its context all the same, once the grace
// for the answer passes, instead of waiting for the thaw.
func TestAnExecsContextEndsItsWaitInAFrozenSandbox(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		p := newProvider(t, m, Options{})
		if p.cg == nil || !p.cg.of("x").canFreeze() {
			t.Skip("SKIP: no freezer cgroup here")
		}
		p.answerGrace = 0
		h := start(t, p, provider.Spec{})
		ctx, cancel := context.WithCancel(context.Background())
		done := execRunning(t, ctx, p, h, "sleep 600")
		g := p.cg.of(h.SandboxID)
		if err := g.freeze(context.Background(), true, time.Minute); err != nil {
			t.Fatal(err)
		}
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("err = %v, want context.Canceled", err)
			}
		case <-time.After(time.Minute): // a hang guard
			t.Error("the exec still waits for a frozen sandbox's command after its context ended")
		}
		if err := g.freeze(context.Background(), false, 0); err != nil {
			t.Fatal(err)
		}
		if err := p.Stop(context.Background(), h); err != nil {
			t.Fatal(err)
		}
	})
}
