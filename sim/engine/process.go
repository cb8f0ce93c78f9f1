package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sched"
)

// errCrashed is what a provider call of a crashed owner process returns.
var errCrashed = errors.New("sim: the owner process crashed")

// process is one owner incarnation's view of the shared fake provider: every
// call the owner makes goes through it. It models what a crash does to a
// process that the simulation cannot kill (its goroutines keep running after
// owner.Abandon): from the moment the process dies, no call of it reaches the
// backend any more, and no call in flight returns a result to it.
//
// A crash is either ordered by the harness (kill) or fired by a trigger armed
// for one step: "before the n-th call of op" (that call never reaches the
// fake) or "after the n-th call of op" (its effect happened, the process
// died before learning the result). Calls of a dead process block until the
// harness has abandoned the owner (bury) or their context ends, then fail:
// the owner is frozen at the crash point instead of running on past it.
type process struct {
	// fk is the backend the provider calls reach (and faults are injected
	// into); inner is what the calls go through to reach it: fk itself, or
	// an OpenSandbox client of a server whose runtime is fk.
	fk    *fake.Provider
	inner backend
	// observe is told about every call that reached the fake, after it
	// returned, with the sandbox (or, for deletes, snapshot) it was about.
	observe func(op fake.Op, sandboxID string, err error)

	mu       sync.Mutex
	dead     bool
	trig     *trigger
	inFlight int
	rt       sched.Runtime
	crashed  chan struct{} // closed when the process dies
	buried   chan struct{} // closed once the owner is abandoned
	changed  chan struct{} // a call left (drain waits on it)
}

// trigger crashes the process at one provider call.
type trigger struct {
	op    fake.Op
	n     int  // the n-th call of op (1-based)
	after bool // after its effect; else before it
	seen  int
	fired bool
}

// crashTrigger kills the process at point at of a run of calls of op: at 0
// before the first call reaches the provider, at k after the k-th call's
// effect.
func crashTrigger(op fake.Op, at int) *trigger {
	if at == 0 {
		return &trigger{op: op, n: 1}
	}
	return &trigger{op: op, n: at, after: true}
}

func (t *trigger) String() string {
	when := "before"
	if t.after {
		when = "after"
	}
	return fmt.Sprintf("%s %s #%d", when, t.op, t.n)
}

// backend is every provider capability.
type backend interface {
	provider.Provider
	provider.Snapshotter
	provider.Leaser
	provider.Lister
}

func newProcess(fk *fake.Provider, inner backend, observe func(fake.Op, string, error), rt sched.Runtime) *process {
	if inner == nil {
		inner = fk
	}
	return &process{
		rt:      sched.Or(rt),
		fk:      fk,
		inner:   inner,
		observe: observe,
		crashed: make(chan struct{}),
		buried:  make(chan struct{}),
		changed: make(chan struct{}, 1),
	}
}

// arm sets the crash trigger for the next calls (nil disarms).
func (p *process) arm(t *trigger) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trig = t
}

// kill makes the process dead now.
func (p *process) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dieLocked()
}

func (p *process) dieLocked() {
	if !p.dead {
		p.dead = true
		close(p.crashed)
	}
}

// bury releases the frozen calls: the owner has been abandoned.
func (p *process) bury() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.buried:
	default:
		close(p.buried)
	}
}

// idle reports whether no call of the process is in flight.
func (p *process) idle() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.inFlight == 0
}

// drain waits until no call of the process is in flight, or until timeout.
func (p *process) drain(timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		n := p.inFlight
		p.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-p.changed:
		case <-deadline.C:
			return fmt.Errorf("%d provider calls of the crashed owner still in flight after %v", n, timeout)
		}
	}
}

// frozen holds a call of the dead process until it is buried or ctx ends.
func (p *process) frozen(ctx context.Context) error {
	p.rt.Await(ctx, func() bool { return sched.Closed(p.buried) })
	select {
	case <-p.buried:
	case <-ctx.Done():
	}
	return errCrashed
}

func (p *process) leave() {
	p.mu.Lock()
	p.inFlight--
	p.mu.Unlock()
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// enter admits a call of op, or fails it if the process is (or now becomes)
// dead.
func (p *process) enter(ctx context.Context, op fake.Op) error {
	p.mu.Lock()
	p.inFlight++
	p.countLocked(op, false)
	dead := p.dead
	p.mu.Unlock()
	if dead {
		err := p.frozen(ctx)
		p.leave()
		return err
	}
	return nil
}

// countLocked counts a call of op toward the armed trigger, at the moment
// after says (after the call's effect, or before it), and kills the process
// when the trigger fires.
func (p *process) countLocked(op fake.Op, after bool) {
	if t := p.trig; !p.dead && t != nil && !t.fired && t.after == after && t.op == op {
		t.seen++
		if t.seen == t.n {
			t.fired = true
			p.dieLocked()
		}
	}
}

// exit ends a call that reached the fake. A dead process (or one the call's
// own trigger kills) does not get the result.
func (p *process) exit(ctx context.Context, op fake.Op, sandboxID string, err error) error {
	if p.observe != nil {
		p.observe(op, sandboxID, err)
	}
	p.mu.Lock()
	p.countLocked(op, true)
	dead := p.dead
	p.mu.Unlock()
	if dead {
		err = p.frozen(ctx)
	}
	p.leave()
	return err
}

// call runs one provider call through the process.
func call[T any](p *process, ctx context.Context, op fake.Op, sandboxID string, fn func() (T, error)) (T, error) {
	var zero T
	if err := p.enter(ctx, op); err != nil {
		return zero, err
	}
	v, err := fn()
	if err := p.exit(ctx, op, sandboxID, err); err != nil {
		return zero, err
	}
	return v, nil
}

func call0(p *process, ctx context.Context, op fake.Op, sandboxID string, fn func() error) error {
	_, err := call(p, ctx, op, sandboxID, func() (struct{}, error) { return struct{}{}, fn() })
	return err
}

// The provider interfaces, delegated to the fake.
var (
	_ provider.Provider    = (*process)(nil)
	_ provider.Snapshotter = (*process)(nil)
	_ provider.Leaser      = (*process)(nil)
	_ provider.Lister      = (*process)(nil)
)

func (p *process) Name() string { return p.inner.Name() }

// Capabilities: every call goes through the process, so that it can die.
func (p *process) Capabilities() provider.Capabilities {
	return provider.Capabilities{Snapshotter: p, Leaser: p, Lister: p}
}

func (p *process) Start(ctx context.Context, spec provider.Spec) (provider.Handle, error) {
	return call(p, ctx, fake.OpStart, "", func() (provider.Handle, error) { return p.inner.Start(ctx, spec) })
}

func (p *process) Stop(ctx context.Context, h provider.Handle) error {
	return call0(p, ctx, fake.OpStop, h.SandboxID, func() error { return p.inner.Stop(ctx, h) })
}

func (p *process) Exec(ctx context.Context, h provider.Handle, req provider.ExecRequest) (provider.ExecResult, error) {
	return call(p, ctx, fake.OpExec, h.SandboxID, func() (provider.ExecResult, error) { return p.inner.Exec(ctx, h, req) })
}

func (p *process) WriteFile(ctx context.Context, h provider.Handle, path string, data []byte) error {
	return call0(p, ctx, fake.OpWriteFile, h.SandboxID, func() error { return p.inner.WriteFile(ctx, h, path, data) })
}

func (p *process) ReadFile(ctx context.Context, h provider.Handle, path string) ([]byte, error) {
	return call(p, ctx, fake.OpReadFile, h.SandboxID, func() ([]byte, error) { return p.inner.ReadFile(ctx, h, path) })
}

func (p *process) Status(ctx context.Context, h provider.Handle) (provider.Status, error) {
	return call(p, ctx, fake.OpStatus, h.SandboxID, func() (provider.Status, error) { return p.inner.Status(ctx, h) })
}

func (p *process) Snapshot(ctx context.Context, h provider.Handle, name string) (string, error) {
	return call(p, ctx, fake.OpSnapshot, h.SandboxID, func() (string, error) { return p.inner.Snapshot(ctx, h, name) })
}

func (p *process) Fork(ctx context.Context, spec provider.Spec, snapshotID string) (provider.Handle, error) {
	return call(p, ctx, fake.OpFork, "", func() (provider.Handle, error) { return p.inner.Fork(ctx, spec, snapshotID) })
}

func (p *process) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	return call0(p, ctx, fake.OpDeleteSnapshot, snapshotID, func() error { return p.inner.DeleteSnapshot(ctx, snapshotID) })
}

func (p *process) Renew(ctx context.Context, h provider.Handle, expiresAt time.Time) error {
	return call0(p, ctx, fake.OpRenew, h.SandboxID, func() error { return p.inner.Renew(ctx, h, expiresAt) })
}

func (p *process) ListSandboxes(ctx context.Context) ([]provider.SandboxInfo, error) {
	return call(p, ctx, fake.OpList, "", func() ([]provider.SandboxInfo, error) { return p.inner.ListSandboxes(ctx) })
}

func (p *process) ListSnapshots(ctx context.Context) ([]provider.SnapshotInfo, error) {
	return call(p, ctx, fake.OpList, "", func() ([]provider.SnapshotInfo, error) { return p.inner.ListSnapshots(ctx) })
}
