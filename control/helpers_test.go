package control_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/problem"
	"github.com/sandboxowner/owner/sched"
)

var t0 = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)

// hooks is a scripted participant that logs what the machine asked of it.
type hooks struct {
	mu       sync.Mutex
	log      []string
	closed   bool
	ready    bool
	blockers []string
	restarts []string
	closeErr error
	// asked, when set, hears of every readiness check.
	asked chan struct{}

	// commit and restore, when set, run in place of the defaults.
	commit  func(ctx context.Context, req control.CommitRequest) (control.CommitResult, error)
	restore func(ctx context.Context, req control.RestoreRequest) (control.RestoreResult, error)
	retire  func(ctx context.Context, eps []control.EpisodeID) error
	// stopWriter, when set, runs in StopWriter.
	stopWriter func(id string)
}

func (h *hooks) note(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.log = append(h.log, fmt.Sprintf(format, args...))
}

func (h *hooks) calls() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.log...)
}

func (h *hooks) set(f func(h *hooks)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f(h)
}

func (h *hooks) CloseAdmission() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closeErr != nil {
		return h.closeErr
	}
	h.closed = true
	h.log = append(h.log, "close")
	return nil
}

func (h *hooks) OpenAdmission() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = false
	h.log = append(h.log, "open")
}

func (h *hooks) isClosed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closed
}

func (h *hooks) Readiness() control.Report {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.asked != nil {
		select {
		case h.asked <- struct{}{}:
		default:
		}
	}
	return control.Report{
		Ready:    h.ready,
		Blockers: append([]string(nil), h.blockers...),
		Restarts: append([]string(nil), h.restarts...),
		Counts:   map[string]int{"inflight": len(h.blockers)},
	}
}

func (h *hooks) Commit(ctx context.Context, req control.CommitRequest) (control.CommitResult, error) {
	h.note("commit %s", req.CheckpointID)
	if h.commit != nil {
		return h.commit(ctx, req)
	}
	return control.CommitResult{
		Manifest:   control.Manifest{CheckpointID: req.CheckpointID, RecordCount: len(req.EpisodeIDs), RecordsSHA256: "abc"},
		EpisodeIDs: control.CaptureKeys(req.EpisodeIDs),
	}, nil
}

func (h *hooks) Restore(ctx context.Context, req control.RestoreRequest) (control.RestoreResult, error) {
	h.note("restore %s", req.CheckpointID)
	if h.restore != nil {
		return h.restore(ctx, req)
	}
	var next []control.EpisodeID
	for _, e := range req.EpisodeIDs {
		next = append(next, e.Next())
	}
	return control.RestoreResult{SourceCheckpointID: req.SourceCheckpointID, Restored: control.CaptureKeys(next)}, nil
}

func (h *hooks) Retire(ctx context.Context, eps []control.EpisodeID) error {
	h.note("retire %v", control.CaptureKeys(eps))
	if h.retire != nil {
		return h.retire(ctx, eps)
	}
	return nil
}

func (h *hooks) Forget(ids []string) { h.note("forget %v", ids) }

func (h *hooks) StopWriter(id string) {
	h.note("stop writer %s", id)
	if h.stopWriter != nil {
		h.stopWriter(id)
	}
}

func (h *hooks) Describe() control.Description {
	return control.Description{Mode: "exported", Verify: "wait"}
}

type rig struct {
	t   *testing.T
	h   *hooks
	clk *clock.Manual
	m   *control.Machine
}

func newRig(t *testing.T) *rig { return newRigOn(t, nil) }

// newRigOn is newRig whose machine runs its hooks on rt (nil: goroutines).
func newRigOn(t *testing.T, rt sched.Runtime) *rig {
	h := &hooks{ready: true}
	clk := clock.NewManual(t0)
	m := control.New(control.Config{Instance: "notes", Hooks: h, Clock: clk, Runtime: rt, LeaseGrace: 600 * time.Second})
	return &rig{t: t, h: h, clk: clk, m: m}
}

// inBothOrders runs f on a rig whose runs end before their callers wait,
// and on one whose runs end while their callers wait.
func inBothOrders(t *testing.T, f func(t *testing.T, r *rig)) {
	t.Run("run ends before the wait", func(t *testing.T) { f(t, newRigOn(t, runsAtGo{})) })
	t.Run("run ends during the wait", func(t *testing.T) { f(t, newRigOn(t, &runsAtWait{})) })
}

// runsAtGo is a runtime on which a run the machine starts ends before Go
// returns, so before its caller waits for it: the order a loaded machine
// may pick, fixed.
type runsAtGo struct{}

func (runsAtGo) Go(fn func())                       { fn() }
func (runsAtGo) Await(context.Context, func() bool) {}

// runsAtWait is a runtime on which a run the machine starts is held until
// its caller waits for it, then runs to its end: the other order, fixed.
type runsAtWait struct {
	mu   sync.Mutex
	held []func()
}

func (r *runsAtWait) Go(fn func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.held = append(r.held, fn)
}

func (r *runsAtWait) Await(context.Context, func() bool) {
	r.mu.Lock()
	held := r.held
	r.held = nil
	r.mu.Unlock()
	for _, fn := range held {
		fn()
	}
}

// base is a request base with a deadline d after the rig's current time.
func (r *rig) base(id string, d time.Duration) control.Base {
	return control.Base{CheckpointID: id, DeadlineTS: control.UnixSeconds(r.clk.Now().Add(d))}
}

var ctx = context.Background()

func (r *rig) prepare(id string) control.PrepareReply {
	r.t.Helper()
	rep, err := r.m.Prepare(ctx, control.PrepareRequest{Base: r.base(id, time.Minute)})
	if err != nil {
		r.t.Fatalf("prepare %s: %v", id, err)
	}
	return rep
}

func (r *rig) commit(id string, eps ...control.EpisodeID) (control.CommitReply, error) {
	return r.m.Commit(ctx, control.CommitRequest{Base: r.base(id, time.Minute), CheckpointDir: "/ck/" + id, EpisodeIDs: eps})
}

func (r *rig) resume(id string) control.ResumeReply {
	r.t.Helper()
	rep, err := r.m.Resume(ctx, control.ResumeRequest{Base: r.base(id, time.Minute)})
	if err != nil {
		r.t.Fatalf("resume %s: %v", id, err)
	}
	return rep
}

func (r *rig) phase() control.Phase {
	p, _ := r.m.Phase()
	return p
}

// wantCode fails unless err is the protocol error with target's code.
func wantCode(t *testing.T, err error, target *problem.Error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error = %v, want %s", err, target.Code)
	}
}

func ep(rollout string, attempt int) control.EpisodeID {
	return control.EpisodeID{RolloutID: rollout, Attempt: attempt}
}
