package actors_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/internal/racebuild"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
)

var shellT0 = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)

// shell is one session actor on a real actor system over a fake provider,
// with the owner's callbacks recorded.
type shell struct {
	t   *testing.T
	sys *actor.ActorSystem
	p   provider.Provider
	clk *clock.Manual
	env *actors.SessionEnv
	pid *actor.PID
	// view is what the actor publishes.
	view *messages.SessionView

	mu     sync.Mutex
	events []string
	// ended hears each OnEnded.
	ended chan struct{}
}

func newShell(t *testing.T, p provider.Provider, opts ...func(*actors.SessionEnv)) *shell {
	s := &shell{t: t, sys: actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) })), p: p, clk: clock.NewManual(shellT0), ended: make(chan struct{}, 8)}
	s.env = &actors.SessionEnv{
		Provider: p, Clock: s.clk, Log: logs.Discard(), Limiter: actors.NewLimiter(1),
		OnEnded: func(id string, stopped *provider.Handle, reason messages.StopReason) {
			s.note("ended %s %s stopped=%v", id, reason, stopped != nil)
			s.ended <- struct{}{}
		},
		OnHeld: func(id string, sb sandbox.Sandbox) { s.note("held %s", id) },
		OnLost: func(id string, sb sandbox.Sandbox) { s.note("lost %s", id) },
	}
	for _, o := range opts {
		o(s.env)
	}
	s.view = &messages.SessionView{}
	s.pid = s.sys.Root.Spawn(actors.SessionPropsPublishing(s.env, s.view, func() *actors.Session { return actors.NewSession("s1") }))
	t.Cleanup(func() { s.sys.Shutdown() })
	return s
}

func (s *shell) note(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, fmt.Sprintf(format, args...))
}

func (s *shell) noted() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.events...)
}

// ask sends a request carrying a reply slot and waits for its answer.
func (s *shell) ask(msg any, slot messages.ReplyTo) any {
	s.t.Helper()
	s.sys.Root.Send(s.pid, msg)
	select {
	case r := <-slot:
		return r
	case <-time.After(time.Minute): // a hang guard only: every answer here comes at once
		s.t.Fatalf("no answer to %T", msg)
		return nil
	}
}

func (s *shell) start(setup sandbox.SetupFunc, spec provider.Spec) *messages.StartReply {
	slot := make(messages.ReplyTo, 1)
	r, _ := s.ask(&messages.StartSandbox{ReqID: 1, Spec: spec, Setup: setup, Reply: slot}, slot).(*messages.StartReply)
	return r
}

func (s *shell) do(fn sandbox.DoFunc) error {
	slot := make(messages.ReplyTo, 1)
	r, _ := s.ask(&messages.Do{ReqID: 2, Fn: fn, Reply: slot}, slot).(*messages.DoReply)
	return r.Err
}

// request asks with protoactor's sender (the coordinator's way).
func (s *shell) request(msg any) any {
	s.t.Helper()
	r, err := s.sys.Root.RequestFuture(s.pid, msg, time.Minute).Result()
	if err != nil {
		s.t.Fatalf("%T: %v", msg, err)
	}
	return r
}

// TestShellStartsAndStops: a start runs setup and answers with the sandbox
// (workdir asked of the sandbox, the setup's data, the lease from the spec);
// the owner hears it held; a stop stops the sandbox and the owner hears it
// ended.
func TestShellStartsAndStops(t *testing.T) {
	p := fake.New(fake.Options{Clock: clock.NewManual(shellT0)})
	var held sandbox.Sandbox
	s := newShell(t, p, func(e *actors.SessionEnv) {
		note := e.OnHeld
		e.OnHeld = func(id string, sb sandbox.Sandbox) { held = sb; note(id, sb) }
	})
	rep := s.start(func(ctx context.Context, pr provider.Provider, sb sandbox.Sandbox) (json.RawMessage, error) {
		return json.RawMessage(`{"seed":1}`), nil
	}, provider.Spec{Workdir: "/work", TTLSeconds: 60})
	if rep.Err != nil {
		t.Fatal(rep.Err)
	}
	if rep.Sandbox.Workdir != "/work" || string(rep.Sandbox.Data) != `{"seed":1}` || !rep.Sandbox.ExpiresAt.Equal(shellT0.Add(time.Minute)) {
		t.Errorf("sandbox %+v: want workdir /work, the setup's data, a lease a minute ahead", rep.Sandbox)
	}
	// The owner heard of it held (before the reply) as the reply has it.
	if diff := cmp.Diff(rep.Sandbox, held); diff != "" {
		t.Errorf("OnHeld's sandbox (-reply +held):\n%s", diff)
	}
	slot := make(messages.ReplyTo, 1)
	stop, _ := s.ask(&messages.StopSandbox{ReqID: 3, Reason: messages.StopEnd, Reply: slot}, slot).(*messages.StopReply)
	if stop.Err != nil || stop.Stopped == nil || stop.Stopped.SandboxID != rep.Sandbox.Handle.SandboxID {
		t.Fatalf("stop: %+v", stop)
	}
	if live := p.LiveSandboxIDs(); len(live) != 0 {
		t.Errorf("sandboxes live after the stop: %v", live)
	}
	if diff := cmp.Diff([]string{"held s1", "ended s1 end stopped=true"}, s.noted()); diff != "" {
		t.Errorf("owner heard (-want +got):\n%s", diff)
	}
}

// TestShellStartWithoutSetupOrLease: no setup gives the data {}; no
// workdir in the spec is asked of the sandbox (pwd); no TTL, no lease.
func TestShellStartWithoutSetupOrLease(t *testing.T) {
	p := &execLog{Provider: fake.New(fake.Options{})}
	s := newShell(t, p)
	rep := s.start(nil, provider.Spec{})
	if rep.Err != nil {
		t.Fatal(rep.Err)
	}
	if rep.Sandbox.Workdir == "" || string(rep.Sandbox.Data) != "{}" || !rep.Sandbox.ExpiresAt.IsZero() {
		t.Errorf("sandbox %+v: want the sandbox's workdir, data {}, no lease", rep.Sandbox)
	}
	// The pwd is bounded, so a sandbox that hangs cannot hold the start.
	if diff := cmp.Diff([]provider.ExecRequest{{Command: "pwd", Timeout: 30 * time.Second}}, p.requests()); diff != "" {
		t.Errorf("exec requests (-want +got):\n%s", diff)
	}
}

// execLog records the exec requests made through it.
type execLog struct {
	provider.Provider
	mu  sync.Mutex
	log []provider.ExecRequest
}

func (e *execLog) Exec(ctx context.Context, h provider.Handle, req provider.ExecRequest) (provider.ExecResult, error) {
	e.mu.Lock()
	e.log = append(e.log, req)
	e.mu.Unlock()
	return e.Provider.Exec(ctx, h, req)
}

func (e *execLog) requests() []provider.ExecRequest {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]provider.ExecRequest(nil), e.log...)
}

// TestShellFailedSetupsStopTheirSandbox: a setup that fails, panics or
// returns something other than a JSON object fails the start with sandbox.ErrSetup
// and leaves no sandbox running; the session can start again.
func TestShellFailedSetupsStopTheirSandbox(t *testing.T) {
	for name, setup := range map[string]sandbox.SetupFunc{
		"error": func(context.Context, provider.Provider, sandbox.Sandbox) (json.RawMessage, error) {
			return nil, errors.New("clone failed")
		},
		"panic": func(context.Context, provider.Provider, sandbox.Sandbox) (json.RawMessage, error) {
			panic("bad grader")
		},
		"array": func(context.Context, provider.Provider, sandbox.Sandbox) (json.RawMessage, error) {
			return json.RawMessage(`[1]`), nil
		},
		"too big": func(context.Context, provider.Provider, sandbox.Sandbox) (json.RawMessage, error) {
			return json.RawMessage(`{"x":"` + strings.Repeat("a", actors.MaxSessionData) + `"}`), nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			p := fake.New(fake.Options{})
			s := newShell(t, p)
			rep := s.start(setup, provider.Spec{Workdir: "/w"})
			if !errors.Is(rep.Err, sandbox.ErrSetup) {
				t.Fatalf("start: %v, want sandbox.ErrSetup", rep.Err)
			}
			if live := p.LiveSandboxIDs(); len(live) != 0 {
				t.Errorf("sandboxes live after a failed setup: %v", live)
			}
			if rep := s.start(nil, provider.Spec{Workdir: "/w"}); rep.Err != nil {
				t.Errorf("a second start: %v", rep.Err)
			}
		})
	}
}

// TestShellStartWithALaunch: a start with a Launch makes the sandbox
// through it and not the provider's Start: the fork's snapshot and workdir
// are the launch's (no pwd asked; a session's own workdir wins), the lease
// runs from when the launch says it began (or now when it says nothing); a
// launch that fails fails the start.
func TestShellStartWithALaunch(t *testing.T) {
	fk := fake.New(fake.Options{Clock: clock.NewManual(shellT0)})
	p := &execLog{Provider: fk}
	began := shellT0.Add(-10 * time.Second)
	var asked provider.Spec
	launch := func(at time.Time, fail error) sandbox.LaunchFunc {
		return func(ctx context.Context, spec provider.Spec) (sandbox.Launched, error) {
			asked = spec
			if fail != nil {
				return sandbox.Launched{}, fail
			}
			h, err := fk.Start(ctx, spec)
			return sandbox.Launched{Handle: h, FromSnapshot: "tmpl-1", Workdir: "/tmpl", StartedAt: at}, err
		}
	}
	start := func(l sandbox.LaunchFunc, spec provider.Spec, workdir string) *messages.StartReply {
		s := newShell(t, p)
		slot := make(messages.ReplyTo, 1)
		r, _ := s.ask(&messages.StartSandbox{ReqID: 1, Spec: spec, Workdir: workdir, Launch: l, Reply: slot}, slot).(*messages.StartReply)
		return r
	}
	rep := start(launch(began, nil), provider.Spec{Image: "x", TTLSeconds: 60}, "")
	if rep.Err != nil {
		t.Fatal(rep.Err)
	}
	got := rep.Sandbox
	if got.FromSnapshot != "tmpl-1" || got.Workdir != "/tmpl" || !got.ExpiresAt.Equal(began.Add(time.Minute)) || asked.Image != "x" {
		t.Errorf("sandbox %+v (launch asked %+v): want the launch's snapshot and workdir, a lease from when it began", got, asked)
	}
	if st := fk.Stats(); st.Calls[fake.OpStart] != 1 || len(p.requests()) != 0 {
		t.Errorf("starts %d, execs %v: want the launch's one start and no pwd", st.Calls[fake.OpStart], p.requests())
	}
	rep = start(launch(time.Time{}, nil), provider.Spec{TTLSeconds: 60}, "/own")
	if rep.Err != nil || !rep.Sandbox.ExpiresAt.Equal(shellT0.Add(time.Minute)) || rep.Sandbox.Workdir != "/own" {
		t.Errorf("start: %+v, %v: want a lease a minute from now, the session's workdir", rep.Sandbox, rep.Err)
	}
	boom := errors.New("no such template")
	if rep := start(launch(began, boom), provider.Spec{}, ""); !errors.Is(rep.Err, boom) || !strings.Contains(rep.Err.Error(), "start sandbox") {
		t.Errorf("a failed launch: %v", rep.Err)
	}
}

// TestValidateSessionData: up to MaxSessionData bytes of JSON object.
func TestValidateSessionData(t *testing.T) {
	obj := `{"x":"` + strings.Repeat("a", actors.MaxSessionData-8) + `"}`
	if len(obj) != actors.MaxSessionData {
		t.Fatalf("test object is %d bytes", len(obj))
	}
	if _, err := actors.ValidateSessionData(json.RawMessage(obj)); err != nil {
		t.Errorf("an object of exactly MaxSessionData bytes: %v", err)
	}
	for _, bad := range []string{obj + " ", "null", `"s"`, "{", "[]", "1", ` {"a":1} x`, `{"a":}`, " \n"} {
		if _, err := actors.ValidateSessionData(json.RawMessage(bad)); !errors.Is(err, sandbox.ErrSetup) {
			t.Errorf("%.20q: %v, want sandbox.ErrSetup", bad, err)
		}
	}
	for _, good := range []string{"{}", ` {"a":[1,{"b":null}],"a":2}` + "\n", "\t{ }"} {
		got, err := actors.ValidateSessionData(json.RawMessage(good))
		if err != nil {
			t.Errorf("%q: %v", good, err)
		} else if string(got) != good {
			t.Errorf("%q came back as %q", good, got)
		}
	}
	// Every seed's setup returns its data: checking it allocates only the
	// copy returned. Not countable under -race (json.Valid's scanner comes
	// from a sync.Pool, which that build drops at random: a full suite run
	// saw 2); the mutants script and a plain go test count it.
	if racebuild.Enabled {
		return
	}
	small := json.RawMessage(`{"token":"t-0123456789abcdef","notes":["a","b"]}`)
	if n := testing.AllocsPerRun(100, func() { _, _ = actors.ValidateSessionData(small) }); n != 1 {
		t.Errorf("validating a small object allocates %.0f times, want 1 (the copy)", n)
	}
}

// TestShellStartFailures: a provider that cannot start fails the start; a
// sandbox whose pwd fails fails it too and is stopped.
func TestShellStartFailures(t *testing.T) {
	p := fake.New(fake.Options{})
	s := newShell(t, p)
	p.FailNext(fake.OpStart, 1)
	if rep := s.start(nil, provider.Spec{}); rep.Err == nil || !strings.Contains(rep.Err.Error(), "start sandbox") {
		t.Errorf("start with a failing provider: %v", rep.Err)
	}
	p.FailNext(fake.OpExec, 1)
	if rep := s.start(nil, provider.Spec{}); rep.Err == nil || !strings.Contains(rep.Err.Error(), "find workdir") {
		t.Errorf("start whose pwd fails: %v", rep.Err)
	}
	if live := p.LiveSandboxIDs(); len(live) != 0 {
		t.Errorf("sandboxes live after a failed start: %v", live)
	}
}

// TestShellDo: an operation runs against the sandbox; its error and a panic
// come back as the reply's error; a call the provider answers "not found"
// marks the sandbox lost, which the owner hears once and later calls are
// refused with.
func TestShellDo(t *testing.T) {
	p := fake.New(fake.Options{})
	s := newShell(t, p)
	sb := s.start(nil, provider.Spec{Workdir: "/w"}).Sandbox
	var saw string
	if err := s.do(func(ctx context.Context, pr provider.Provider, got sandbox.Sandbox) error {
		saw = got.Handle.SandboxID
		return pr.WriteFile(ctx, got.Handle, "/w/a", []byte("x"))
	}); err != nil || saw != sb.Handle.SandboxID {
		t.Fatalf("do: %v on %q", err, saw)
	}
	if err := s.do(func(context.Context, provider.Provider, sandbox.Sandbox) error { return errors.New("tool failed") }); err == nil || err.Error() != "tool failed" {
		t.Errorf("do returning an error: %v", err)
	}
	if err := s.do(func(context.Context, provider.Provider, sandbox.Sandbox) error { panic("oops") }); err == nil || !strings.Contains(err.Error(), "panic: oops") {
		t.Errorf("do that panics: %v", err)
	}
	// Each of the watched calls on another sandbox, or failing otherwise,
	// loses nothing.
	other := provider.Handle{SandboxID: "elsewhere", Provider: "fake"}
	if err := s.do(func(ctx context.Context, pr provider.Provider, got sandbox.Sandbox) error {
		_, _ = pr.Exec(ctx, other, provider.ExecRequest{Command: "true"})
		_, _ = pr.ReadFile(ctx, got.Handle, "/w/missing")
		return nil
	}); err != nil {
		t.Fatalf("do: %v", err)
	}
	if diff := cmp.Diff([]string{"held s1"}, s.noted()); diff != "" {
		t.Fatalf("owner heard (-want +got):\n%s", diff)
	}
	for _, call := range []func(ctx context.Context, pr provider.Provider, h provider.Handle) error{
		func(ctx context.Context, pr provider.Provider, h provider.Handle) error {
			_, err := pr.Exec(ctx, h, provider.ExecRequest{Command: "true"})
			return err
		},
		func(ctx context.Context, pr provider.Provider, h provider.Handle) error {
			return pr.WriteFile(ctx, h, "/w/a", nil)
		},
		func(ctx context.Context, pr provider.Provider, h provider.Handle) error {
			_, err := pr.ReadFile(ctx, h, "/w/a")
			return err
		},
		func(ctx context.Context, pr provider.Provider, h provider.Handle) error {
			_, err := pr.Status(ctx, h)
			return err
		},
	} {
		p2 := fake.New(fake.Options{})
		s2 := newShell(t, p2)
		h := s2.start(nil, provider.Spec{Workdir: "/w"}).Sandbox.Handle
		if err := p2.Stop(context.Background(), h); err != nil {
			t.Fatal(err)
		}
		// The operation swallows the error; the loss is still seen.
		if err := s2.do(func(ctx context.Context, pr provider.Provider, sb sandbox.Sandbox) error {
			_ = call(ctx, pr, sb.Handle)
			return nil
		}); !errors.Is(err, sandbox.ErrLost) {
			t.Errorf("do whose call found the sandbox gone: %v, want sandbox.ErrLost", err)
		}
		if diff := cmp.Diff([]string{"held s1", "lost s1"}, s2.noted()); diff != "" {
			t.Errorf("owner heard (-want +got):\n%s", diff)
		}
	}
}

// TestShellSnapshots: a snapshot round's request is answered to its sender
// with the snapshot; a provider that cannot snapshot answers
// ErrUnsupported; a deadline already past (on the wall clock, where it ends
// the call at once) fails the snapshot without taking one.
func TestShellSnapshots(t *testing.T) {
	p := fake.New(fake.Options{})
	s := newShell(t, p)
	sb := s.start(nil, provider.Spec{Workdir: "/w"}).Sandbox
	rep, _ := s.request(&messages.TakeSnapshot{Round: 1, Name: "ck1"}).(*messages.SnapshotReply)
	if rep == nil || rep.Err != nil || rep.SnapshotID == "" || rep.Round != 1 || rep.Sandbox.Handle.SandboxID != sb.Handle.SandboxID || !rep.At.Equal(shellT0) {
		t.Fatalf("snapshot reply %+v", rep)
	}

	wp := fake.New(fake.Options{})
	ws := newShell(t, wp)
	ws.env.Clock = clock.Real{} // before any message: the actor reads it only when it performs
	ws.start(nil, provider.Spec{Workdir: "/w"})
	rep, _ = ws.request(&messages.TakeSnapshot{Round: 2, Name: "ck2", Deadline: time.Now().Add(-time.Second)}).(*messages.SnapshotReply)
	if rep == nil || !errors.Is(rep.Err, context.DeadlineExceeded) || wp.Stats().Calls[fake.OpSnapshot] != 0 {
		t.Errorf("snapshot past its deadline: %+v (%d snapshot calls)", rep, wp.Stats().Calls[fake.OpSnapshot])
	}
	rep, _ = ws.request(&messages.TakeSnapshot{Round: 3, Name: "ck3", Deadline: time.Now().Add(time.Hour)}).(*messages.SnapshotReply)
	if rep == nil || rep.Err != nil || rep.SnapshotID == "" {
		t.Errorf("snapshot within its deadline: %+v", rep)
	}

	ns := newShell(t, fake.NewWithoutSnapshots(fake.Options{}))
	ns.start(nil, provider.Spec{Workdir: "/w"})
	rep, _ = ns.request(&messages.TakeSnapshot{Round: 1, Name: "ck1"}).(*messages.SnapshotReply)
	if rep == nil || !errors.Is(rep.Err, provider.ErrUnsupported) {
		t.Errorf("snapshot on a provider without snapshots: %+v", rep)
	}
}

// TestShellStopsBoundedByTheLimiter: a retire's stop waits for a limiter
// slot (a checkpoint call holds the only one) and fails with its bound; an
// end's stop does not wait.
func TestShellStopsBoundedByTheLimiter(t *testing.T) {
	p := fake.New(fake.Options{})
	s := newShell(t, p)
	s.env.StopTimeout = time.Minute
	s.start(nil, provider.Spec{Workdir: "/w"})
	if err := s.env.Limiter.Acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	slot := make(messages.ReplyTo, 1)
	s.sys.Root.Send(s.pid, &messages.StopSandbox{ReqID: 3, Reason: messages.StopRetire, Reply: slot})
	// The retire waits for a slot; its bound passes on the session's
	// clock only once it is seen waiting.
	for n, changed := s.env.Limiter.Waiting(); n != 1; n, changed = s.env.Limiter.Waiting() {
		<-changed
	}
	s.clk.Advance(time.Minute)
	var stop *messages.StopReply
	select {
	case r := <-slot:
		stop, _ = r.(*messages.StopReply)
	case <-time.After(time.Minute): // a hang guard only
		t.Fatal("no answer to the retire once its bound passed")
	}
	if stop == nil || !errors.Is(stop.Err, context.DeadlineExceeded) || len(p.LiveSandboxIDs()) != 1 {
		t.Fatalf("retire with no limiter slot: %+v, live %v", stop, p.LiveSandboxIDs())
	}
	slot = make(messages.ReplyTo, 1)
	stop, _ = s.ask(&messages.StopSandbox{ReqID: 4, Reason: messages.StopEnd, Reply: slot}, slot).(*messages.StopReply)
	if stop == nil || stop.Err != nil || len(p.LiveSandboxIDs()) != 0 {
		t.Fatalf("end with no limiter slot: %+v, live %v", stop, p.LiveSandboxIDs())
	}
	s.env.Limiter.Release()
}

// TestShellStopFailure: a stop the provider refuses fails with the sandbox
// named.
func TestShellStopFailure(t *testing.T) {
	p := fake.New(fake.Options{})
	s := newShell(t, p)
	sb := s.start(nil, provider.Spec{Workdir: "/w"}).Sandbox
	p.FailNext(fake.OpStop, 1)
	slot := make(messages.ReplyTo, 1)
	stop, _ := s.ask(&messages.StopSandbox{ReqID: 3, Reason: messages.StopPark, Reply: slot}, slot).(*messages.StopReply)
	if stop == nil || stop.Err == nil || !strings.Contains(stop.Err.Error(), "stop sandbox "+sb.Handle.SandboxID) {
		t.Fatalf("stop refused by the provider: %+v", stop)
	}
}

// TestShellRenewsTheLease: a renewal due moves the provider's lease to now
// plus the spec's TTL.
func TestShellRenewsTheLease(t *testing.T) {
	defer hangGuard()() // it waits for the provider's renewal, which a wrong renewal never calls
	pclk := clock.NewManual(shellT0)
	p := fake.New(fake.Options{Clock: pclk})
	renewed := make(chan struct{}, 1)
	p.SetHook(func(c fake.Call) {
		if c.Op == fake.OpRenew && c.Phase == fake.PhaseEnd {
			renewed <- struct{}{}
		}
	})
	s := newShell(t, p)
	s.start(nil, provider.Spec{Workdir: "/w", TTLSeconds: 90})
	now := shellT0.Add(time.Minute)
	pclk.Set(now)
	s.sys.Root.Send(s.pid, &messages.RenewLease{Now: now})
	<-renewed
	list, err := p.ListSandboxes(context.Background())
	if err != nil || len(list) != 1 || !list[0].ExpiresAt.Equal(now.Add(90*time.Second)) {
		t.Fatalf("after the renewal: %+v %v, want one sandbox leased until now + 90 s", list, err)
	}
}

// TestShellAbandonStopsTheSandbox: an actor stopped while it holds a
// sandbox stops the sandbox, and the owner hears the session ended.
func TestShellAbandonStopsTheSandbox(t *testing.T) {
	defer hangGuard()() // it waits for OnEnded, which a wrong abandon never calls
	p := fake.New(fake.Options{})
	s := newShell(t, p)
	s.start(nil, provider.Spec{Workdir: "/w"})
	if err := s.sys.Root.StopFuture(s.pid).Wait(); err != nil {
		t.Fatal(err)
	}
	<-s.ended
	if diff := cmp.Diff([]string{"held s1", "ended s1 end stopped=true"}, s.noted()); diff != "" {
		t.Errorf("owner heard (-want +got):\n%s", diff)
	}
	if live := p.LiveSandboxIDs(); len(live) != 0 {
		t.Errorf("sandboxes live after the actor stopped: %v", live)
	}
}

// TestShellPublishesItsView: the actor publishes what a GetSandbox would
// answer from the spawn on, each change before the reply of the request
// that made it (a caller who heard the start's reply reads the sandbox
// held), a lease renewal's new expiry, a stop, and nothing held once the
// actor is gone.
func TestShellPublishesItsView(t *testing.T) {
	defer hangGuard()() // it waits for the provider's renewal and for a view that shows it
	pclk := clock.NewManual(shellT0)
	p := fake.New(fake.Options{Clock: pclk})
	renewed := make(chan struct{}, 1)
	p.SetHook(func(c fake.Call) {
		if c.Op == fake.OpRenew && c.Phase == fake.PhaseEnd {
			renewed <- struct{}{}
		}
	})
	s := newShell(t, p)
	if diff := cmp.Diff(&messages.GetSandboxReply{}, s.view.Load()); diff != "" {
		t.Fatalf("view of a new session (-want +got):\n%s", diff)
	}
	// One value for every session that shows nothing, not a copy each.
	if other := newShell(t, p); other.view.Load() != s.view.Load() {
		t.Errorf("two new sessions publish %p and %p, want one shared view", other.view.Load(), s.view.Load())
	}
	inSetup, release := make(chan *messages.GetSandboxReply, 1), make(chan struct{})
	slot := make(messages.ReplyTo, 1)
	s.sys.Root.Send(s.pid, &messages.StartSandbox{ReqID: 1, Spec: provider.Spec{Workdir: "/w", TTLSeconds: 90}, Reply: slot,
		Setup: func(context.Context, provider.Provider, sandbox.Sandbox) (json.RawMessage, error) {
			inSetup <- s.view.Load()
			<-release
			return nil, nil
		}})
	if v := <-inSetup; !v.Starting || v.Held {
		t.Errorf("view during setup: %+v, want starting and not held", v)
	}
	close(release)
	rep := (<-slot).(*messages.StartReply)
	if diff := cmp.Diff(&messages.GetSandboxReply{SessionID: "s1", Sandbox: rep.Sandbox, Held: true}, s.view.Load()); diff != "" {
		t.Errorf("view right after the start's reply (-want +got):\n%s", diff)
	}
	now := shellT0.Add(time.Minute)
	pclk.Set(now)
	s.sys.Root.Send(s.pid, &messages.RenewLease{Now: now})
	<-renewed
	// The renewal's outcome reaches the mailbox after the provider's
	// call: ask until an answer shows it (each ask is one mailbox turn).
	var asked *messages.GetSandboxReply
	for asked == nil || asked.Sandbox.ExpiresAt.Equal(rep.Sandbox.ExpiresAt) {
		slot := make(messages.ReplyTo, 1)
		asked = s.ask(&messages.GetSandbox{Reply: slot}, slot).(*messages.GetSandboxReply)
	}
	if diff := cmp.Diff(asked, s.view.Load()); diff != "" {
		t.Errorf("view after the renewal against the answer of an ask (-want +got):\n%s", diff)
	}
	stop, _ := s.ask(&messages.StopSandbox{ReqID: 3, Reason: messages.StopEnd, Reply: slot}, slot).(*messages.StopReply)
	if stop == nil || stop.Err != nil {
		t.Fatalf("stop: %+v", stop)
	}
	if v := s.view.Load(); v.Held || v.Starting {
		t.Errorf("view after the stop: %+v, want nothing held", v)
	}
	if err := s.sys.Root.StopFuture(s.pid).Wait(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&messages.GetSandboxReply{}, s.view.Load()); diff != "" {
		t.Errorf("view once the actor stopped (-want +got):\n%s", diff)
	}
}

// TestShellIdleStopCountsTheViewsUses: a conditional (idle) stop is decided
// against the last use a request touched in the session's view: a use after
// IdleSince keeps the sandbox (NotIdle); with no use since, it stops.
func TestShellIdleStopCountsTheViewsUses(t *testing.T) {
	p := fake.New(fake.Options{})
	s := newShell(t, p)
	sb := s.start(nil, provider.Spec{Workdir: "/w"}).Sandbox
	s.view.Touch(shellT0.Add(10 * time.Second))
	slot := make(messages.ReplyTo, 1)
	stop, _ := s.ask(&messages.StopSandbox{ReqID: 3, Reason: messages.StopIdle, IdleSince: shellT0.Add(5 * time.Second), Reply: slot}, slot).(*messages.StopReply)
	if stop == nil || !stop.NotIdle || stop.Stopped != nil {
		t.Fatalf("idle stop since 5 s, used at 10 s: %+v, want NotIdle", stop)
	}
	if live := p.LiveSandboxIDs(); len(live) != 1 {
		t.Fatalf("sandboxes live after a refused idle stop: %v, want its one", live)
	}
	stop, _ = s.ask(&messages.StopSandbox{ReqID: 4, Reason: messages.StopIdle, IdleSince: shellT0.Add(20 * time.Second), Reply: slot}, slot).(*messages.StopReply)
	if stop == nil || stop.NotIdle || stop.Stopped == nil || stop.Stopped.SandboxID != sb.Handle.SandboxID {
		t.Fatalf("idle stop since 20 s, last used at 10 s: %+v, want its sandbox stopped", stop)
	}
}

// inline runs each effect on the caller's goroutine (the actor's), so that
// whatever the actor starts has happened once it handled its message.
type inline struct{}

func (inline) Go(fn func())                       { fn() }
func (inline) Await(context.Context, func() bool) {}

// TestShellAbandonWithoutASandboxStopsNothing: an actor stopped before it
// ever held a sandbox stops none and tells the owner of no end.
func TestShellAbandonWithoutASandboxStopsNothing(t *testing.T) {
	p := &stopLog{Provider: fake.New(fake.Options{})}
	s := newShell(t, p, func(e *actors.SessionEnv) { e.Runtime = inline{} })
	if err := s.sys.Root.StopFuture(s.pid).Wait(); err != nil {
		t.Fatal(err)
	}
	if got := s.noted(); len(got) != 0 {
		t.Errorf("owner heard %q from an actor that held nothing, want nothing", got)
	}
	if n := p.stops.Load(); n != 0 {
		t.Errorf("%d provider stops from an actor that held nothing, want none", n)
	}
}

// TestShellUnlistedActorLeavesItsSandbox: an actor made ahead for a
// restore (its view unlisted) that stops holding its fork stops nothing
// and tells the owner of no end (the restore stops its forks); once
// listed, it stops its sandbox as any other.
func TestShellUnlistedActorLeavesItsSandbox(t *testing.T) {
	for _, listed := range []bool{false, true} {
		fk := fake.New(fake.Options{})
		h, err := fk.Start(context.Background(), provider.Spec{})
		if err != nil {
			t.Fatal(err)
		}
		p := &stopLog{Provider: fk}
		s := newShell(t, p, func(e *actors.SessionEnv) { e.Runtime = inline{} })
		view := &messages.SessionView{}
		view.SetUnlisted(true)
		pid := s.sys.Root.Spawn(actors.SessionPropsPublishing(s.env, view, func() *actors.Session {
			return actors.NewInstalledSession("r1", sandbox.Sandbox{Handle: h})
		}))
		if listed {
			view.SetUnlisted(false)
		}
		if err := s.sys.Root.StopFuture(pid).Wait(); err != nil {
			t.Fatal(err)
		}
		want, wantNoted := int32(0), []string(nil)
		if listed {
			want, wantNoted = 1, []string{"ended r1 end stopped=true"}
		}
		if n := p.stops.Load(); n != want {
			t.Errorf("listed %v: %d provider stops, want %d", listed, n, want)
		}
		if diff := cmp.Diff(wantNoted, s.noted()); diff != "" {
			t.Errorf("listed %v: owner heard (-want +got):\n%s", listed, diff)
		}
	}
}

// stopLog counts the provider's stops.
type stopLog struct {
	provider.Provider
	stops atomic.Int32
}

func (l *stopLog) Stop(ctx context.Context, h provider.Handle) error {
	l.stops.Add(1)
	return l.Provider.Stop(ctx, h)
}

// forgetRecorder spawns a session actor as its child (as the supervisor
// does) and passes on the forgets the child sends it.
type forgetRecorder struct {
	props  *actor.Props
	child  chan<- *actor.PID
	forget chan<- *messages.ForgetSession
}

func (r *forgetRecorder) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		r.child <- ctx.Spawn(r.props)
	case *messages.ForgetSession:
		r.forget <- m
	}
}

// A session that ended asks its parent to forget it as ended: it needs no
// word back.
func TestShellAnEndedSessionAsksToBeForgottenAsEnded(t *testing.T) {
	s := newShell(t, fake.New(fake.Options{Clock: clock.NewManual(shellT0)}))
	child, forget := make(chan *actor.PID, 1), make(chan *messages.ForgetSession, 1)
	props := actors.SessionProps(s.env, func() *actors.Session { return actors.NewSession("s2") })
	s.sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor {
		return &forgetRecorder{props: props, child: child, forget: forget}
	}))
	s.pid = <-child
	if rep := s.start(nil, provider.Spec{Workdir: "/work"}); rep.Err != nil {
		t.Fatal(rep.Err)
	}
	slot := make(messages.ReplyTo, 1)
	if stop, _ := s.ask(&messages.StopSandbox{ReqID: 3, Reason: messages.StopEnd, Reply: slot}, slot).(*messages.StopReply); stop.Err != nil {
		t.Fatalf("stop: %+v", stop)
	}
	got := <-forget
	if diff := cmp.Diff(messages.ForgetSession{SessionID: "s2", PID: s.pid, Ended: true}, *got); diff != "" {
		t.Errorf("forget (-want +got):\n%s", diff)
	}
}

// A stop under way still holds the sandbox: the view that says so stays
// published as it was (no new copy of the same), until the stop ends; then
// the session shows nothing, its lease included: the shared empty view.
func TestShellAStopPublishesOnlyItsEnd(t *testing.T) {
	p := fake.New(fake.Options{Clock: clock.NewManual(shellT0)})
	s := newShell(t, p)
	if rep := s.start(nil, provider.Spec{Workdir: "/w", TTLSeconds: 60}); rep.Err != nil {
		t.Fatal(rep.Err)
	}
	held := s.view.Load()
	during := make(chan *messages.GetSandboxReply, 1)
	p.SetHook(func(c fake.Call) {
		if c.Op == fake.OpStop && c.Phase == fake.PhaseBegin {
			during <- s.view.Load()
		}
	})
	slot := make(messages.ReplyTo, 1)
	if stop, _ := s.ask(&messages.StopSandbox{ReqID: 3, Reason: messages.StopEnd, Reply: slot}, slot).(*messages.StopReply); stop == nil || stop.Err != nil {
		t.Fatalf("stop: %+v", stop)
	}
	if v := <-during; v != held {
		t.Errorf("view during the stop %p %+v, want the one published at the start, %p", v, v, held)
	}
	if v, empty := s.view.Load(), newShell(t, p).view.Load(); v != empty {
		t.Errorf("view after the stop: %p %+v, want the shared empty one, %p", v, v, empty)
	}
}
