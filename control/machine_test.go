package control_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/problem"
)

// step is one operation of a scripted run and what it must answer.
type step struct {
	op   string // a control.Op*, or "notready" / "ready" to script readiness
	id   string
	eps  []control.EpisodeID
	dir  string // commit/restore checkpoint_dir (default /ck/<id>)
	want string // error code, "" for success
	// phase is the phase after the step ("" skips the check).
	phase control.Phase
}

func (r *rig) do(s step) error {
	dir := s.dir
	if dir == "" {
		dir = "/ck/" + s.id
	}
	b := r.base(s.id, time.Minute)
	var err error
	switch s.op {
	case "ready":
		r.h.set(func(h *hooks) { h.ready, h.blockers = true, nil })
	case "notready":
		r.h.set(func(h *hooks) { h.ready, h.blockers = false, []string{"r1"} })
	case control.OpPrepare:
		var rep control.PrepareReply
		// Not ready answers at once: the deadline is already due.
		b.DeadlineTS = control.UnixSeconds(r.clk.Now())
		rep, err = r.m.Prepare(ctx, control.PrepareRequest{Base: b})
		if err == nil && !rep.Report.Ready && rep.Phase != control.PhasePreparing {
			return fmt.Errorf("not ready but phase %s", rep.Phase)
		}
	case control.OpCommit:
		_, err = r.m.Commit(ctx, control.CommitRequest{Base: b, CheckpointDir: dir, EpisodeIDs: s.eps})
	case control.OpRestore:
		_, err = r.m.Restore(ctx, control.RestoreRequest{Base: b, CheckpointDir: dir, EpisodeIDs: s.eps})
	case control.OpResume:
		_, err = r.m.Resume(ctx, control.ResumeRequest{Base: b})
	case control.OpRetire:
		_, err = r.m.Retire(ctx, control.RetireRequest{Base: b, EpisodeIDs: s.eps})
	case control.OpForget:
		_, err = r.m.Forget(ctx, control.ForgetRequest{Base: b, RolloutIDs: []string{"r1"}})
	case control.OpRenew:
		_, err = r.m.Renew(ctx, control.RenewRequest{Base: b})
	default:
		return fmt.Errorf("unknown op %q", s.op)
	}
	return err
}

// TestScripts runs the admission rules (stale, conflict, recorded, phase) as
// data: each case is a sequence of operations with their expected outcome.
func TestScripts(t *testing.T) {
	r1 := []control.EpisodeID{ep("r1", 0)}
	cases := []struct {
		name  string
		steps []step
	}{
		{"full cycle", []step{
			{op: "prepare", id: "c1", phase: control.PhasePrepared},
			{op: "commit", id: "c1", eps: r1, phase: control.PhaseCommitted},
			{op: "renew", id: "c1", phase: control.PhaseCommitted},
			{op: "resume", id: "c1", phase: control.PhaseIdle},
		}},
		{"prepare retried after ready returns the recorded reply", []step{
			{op: "prepare", id: "c1", phase: control.PhasePrepared},
			{op: "prepare", id: "c1", phase: control.PhasePrepared},
		}},
		{"prepare retried after commit returns the recorded reply", []step{
			{op: "prepare", id: "c1"},
			{op: "commit", id: "c1"},
			{op: "prepare", id: "c1", phase: control.PhaseCommitted},
		}},
		{"not ready stays preparing, a retry waits again", []step{
			{op: "notready"},
			{op: "prepare", id: "c1", phase: control.PhasePreparing},
			{op: "ready"},
			{op: "prepare", id: "c1", phase: control.PhasePrepared},
		}},
		{"another id conflicts", []step{
			{op: "prepare", id: "c1"},
			{op: "prepare", id: "c2", want: "checkpoint_conflict"},
			{op: "commit", id: "c2", want: "checkpoint_conflict"},
			{op: "resume", id: "c2", want: "checkpoint_conflict"},
			{op: "renew", id: "c2", want: "checkpoint_conflict"},
			{op: "retire", id: "c2", eps: r1, want: "checkpoint_conflict"},
			{op: "restore", id: "c2", eps: r1, want: "checkpoint_conflict", phase: control.PhasePrepared},
		}},
		{"a resumed id is stale except to resume", []step{
			{op: "prepare", id: "c1"},
			{op: "resume", id: "c1"},
			{op: "prepare", id: "c1", want: "stale_checkpoint"},
			{op: "commit", id: "c1", want: "stale_checkpoint"},
			{op: "restore", id: "c1", eps: r1, want: "stale_checkpoint"},
			{op: "renew", id: "c1", want: "stale_checkpoint"},
			{op: "resume", id: "c1", phase: control.PhaseIdle},
		}},
		{"a resume while idle fences a late prepare", []step{
			{op: "resume", id: "c1", phase: control.PhaseIdle},
			{op: "prepare", id: "c1", want: "stale_checkpoint", phase: control.PhaseIdle},
		}},
		{"phases", []step{
			{op: "commit", id: "c1", want: "invalid_phase"},
			{op: "renew", id: "c1", want: "invalid_phase"},
			{op: "notready"},
			{op: "prepare", id: "c1"},
			{op: "commit", id: "c1", want: "invalid_phase"},
			{op: "restore", id: "c1", eps: r1, want: "invalid_phase"},
			{op: "retire", id: "c1", eps: r1, want: "invalid_phase"},
			{op: "forget", id: "c1", want: "invalid_phase"},
			{op: "ready"},
			{op: "prepare", id: "c1"},
			{op: "retire", id: "c1", eps: r1, want: "invalid_phase"},
			{op: "commit", id: "c1"},
			{op: "forget", id: "c1", want: "invalid_phase", phase: control.PhaseCommitted},
		}},
		{"commit rechecks readiness and can be retried", []step{
			{op: "prepare", id: "c1"},
			{op: "notready"},
			{op: "commit", id: "c1", want: "invalid_phase", phase: control.PhasePrepared},
			{op: "ready"},
			{op: "commit", id: "c1", phase: control.PhaseCommitted},
		}},
		{"recorded commit: same scope in another order, other dir conflicts", []step{
			{op: "prepare", id: "c1"},
			{op: "commit", id: "c1", eps: []control.EpisodeID{ep("a", 0), ep("b", 1)}},
			{op: "commit", id: "c1", eps: []control.EpisodeID{ep("b", 1), ep("a", 0)}},
			{op: "commit", id: "c1", eps: []control.EpisodeID{ep("a", 0)}, want: "checkpoint_conflict"},
			{op: "commit", id: "c1", eps: []control.EpisodeID{ep("a", 0), ep("b", 1)}, dir: "/other", want: "checkpoint_conflict"},
		}},
		{"restore, retire in restored, forget, resume", []step{
			{op: "restore", id: "c1", eps: r1, phase: control.PhaseRestored},
			{op: "restore", id: "c1", eps: r1, phase: control.PhaseRestored},
			{op: "restore", id: "c1", eps: []control.EpisodeID{ep("r2", 0)}, want: "checkpoint_conflict"},
			{op: "prepare", id: "c1", want: "invalid_phase"},
			{op: "retire", id: "c1", eps: r1},
			{op: "forget", id: "c1"},
			{op: "renew", id: "c1"},
			{op: "resume", id: "c1", phase: control.PhaseIdle},
		}},
		{"retire and forget under a resumed id are stale", []step{
			{op: "prepare", id: "c1"},
			{op: "resume", id: "c1"},
			{op: "retire", id: "c1", eps: r1, want: "stale_checkpoint"},
			{op: "forget", id: "c1", want: "stale_checkpoint", phase: control.PhaseIdle},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			for i, s := range tc.steps {
				err := r.do(s)
				got := ""
				var ce *problem.Error
				if errors.As(err, &ce) {
					got = ce.Code
				} else if err != nil {
					got = err.Error()
				}
				if got != s.want {
					t.Fatalf("step %d %s %s: error %q, want %q", i, s.op, s.id, got, s.want)
				}
				if s.phase != "" && r.phase() != s.phase {
					t.Fatalf("step %d %s %s: phase %s, want %s", i, s.op, s.id, r.phase(), s.phase)
				}
			}
		})
	}
}

func TestValidation(t *testing.T) {
	r := newRig(t)
	good := r.base("c1", time.Minute)
	cases := []struct {
		name string
		run  func() error
	}{
		{"empty id", func() error {
			_, err := r.m.Prepare(ctx, control.PrepareRequest{Base: control.Base{DeadlineTS: good.DeadlineTS}})
			return err
		}},
		{"id with a slash", func() error {
			_, err := r.m.Prepare(ctx, control.PrepareRequest{Base: control.Base{CheckpointID: "a/b", DeadlineTS: good.DeadlineTS}})
			return err
		}},
		{"id too long", func() error {
			_, err := r.m.Prepare(ctx, control.PrepareRequest{Base: control.Base{CheckpointID: strings.Repeat("a", 129), DeadlineTS: good.DeadlineTS}})
			return err
		}},
		{"no deadline", func() error {
			_, err := r.m.Resume(ctx, control.ResumeRequest{Base: control.Base{CheckpointID: "c1"}})
			return err
		}},
		{"commit without dir", func() error {
			_, err := r.m.Commit(ctx, control.CommitRequest{Base: good})
			return err
		}},
		{"restore without source", func() error {
			_, err := r.m.Restore(ctx, control.RestoreRequest{Base: good, EpisodeIDs: []control.EpisodeID{}})
			return err
		}},
		{"restore without episode_ids", func() error {
			_, err := r.m.Restore(ctx, control.RestoreRequest{Base: good, CheckpointDir: "/ck"})
			return err
		}},
		{"retire of nothing", func() error {
			_, err := r.m.Retire(ctx, control.RetireRequest{Base: good})
			return err
		}},
		{"retire of a rollout id that looks like a capture key", func() error {
			_, err := r.m.Retire(ctx, control.RetireRequest{Base: good, EpisodeIDs: []control.EpisodeID{ep("r-a1", 0)}})
			return err
		}},
		{"negative attempt", func() error {
			_, err := r.m.Retire(ctx, control.RetireRequest{Base: good, EpisodeIDs: []control.EpisodeID{ep("r", -1)}})
			return err
		}},
		{"forget of nothing", func() error {
			_, err := r.m.Forget(ctx, control.ForgetRequest{Base: good})
			return err
		}},
		{"forget of an invalid rollout id", func() error {
			_, err := r.m.Forget(ctx, control.ForgetRequest{Base: good, RolloutIDs: []string{"r1", "r/2"}})
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { wantCode(t, tc.run(), control.ErrInvalidRequest) })
	}
	if got := r.h.calls(); len(got) != 0 {
		t.Errorf("invalid requests reached the hooks: %v", got)
	}
}

func TestCaptureKeys(t *testing.T) {
	cases := []struct {
		key  string
		want control.EpisodeID
		bad  bool
	}{
		{key: "r1", want: ep("r1", 0)},
		{key: "r1-a1", want: ep("r1", 1)},
		{key: "roll.out_x-a12", want: ep("roll.out_x", 12)},
		{key: "r-1", want: ep("r-1", 0)},
		{key: "r-a0", bad: true},
		{key: "r-a01", bad: true},
		{key: "r-a1-a2", bad: true},
		{key: "", bad: true},
		{key: "-r", bad: true},
		{key: "r/x", bad: true},
		{key: strings.Repeat("r", control.MaxIDLen), want: ep(strings.Repeat("r", control.MaxIDLen), 0)},
		{key: strings.Repeat("r", control.MaxIDLen+1), bad: true},
	}
	for _, tc := range cases {
		got, err := control.ParseCaptureKey(tc.key)
		if tc.bad {
			if err == nil {
				t.Errorf("ParseCaptureKey(%q) = %v, want an error", tc.key, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseCaptureKey(%q) = %v, %v; want %v", tc.key, got, err, tc.want)
		}
		if back := got.CaptureKey(); back != tc.key {
			t.Errorf("%v.CaptureKey() = %q, want %q", got, back, tc.key)
		}
	}
	if diff := cmp.Diff([]string{"a", "a-a2", "b"}, control.CaptureKeys([]control.EpisodeID{ep("b", 0), ep("a", 2), ep("a", 0), ep("b", 0)})); diff != "" {
		t.Errorf("CaptureKeys (-want +got):\n%s", diff)
	}
}

func TestPrepareClosesAdmissionOnceAndRecordsReady(t *testing.T) {
	r := newRig(t)
	first := r.prepare("c1")
	again := r.prepare("c1")
	if diff := cmp.Diff(first, again); diff != "" {
		t.Errorf("retried prepare differs (-first +again):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"close"}, r.h.calls()); diff != "" {
		t.Errorf("hook calls (-want +got):\n%s", diff)
	}
	want := control.PrepareReply{Phase: control.PhasePrepared, Report: control.Report{
		Ready: true, Blockers: []string{}, Restarts: []string{}, Counts: map[string]int{"inflight": 0},
	}}
	if diff := cmp.Diff(want, first); diff != "" {
		t.Errorf("prepare reply (-want +got):\n%s", diff)
	}
}

func TestPrepareWaitsForReadiness(t *testing.T) {
	r := newRig(t)
	r.h.set(func(h *hooks) { h.ready, h.blockers = false, []string{"r1"} })
	done := make(chan control.PrepareReply)
	go func() {
		rep, err := r.m.Prepare(ctx, control.PrepareRequest{Base: r.base("c1", time.Minute)})
		if err != nil {
			t.Errorf("prepare: %v", err)
		}
		done <- rep
	}()
	r.h.set(func(h *hooks) { h.ready, h.blockers = true, nil })
	r.m.Notify()
	if rep := <-done; rep.Phase != control.PhasePrepared {
		t.Fatalf("phase %s, want prepared", rep.Phase)
	}
}

func TestPreparePastDeadlineReportsBlockersAndKeepsAdmissionClosed(t *testing.T) {
	r := newRig(t)
	blockers := make([]string, 150)
	for i := range blockers {
		blockers[i] = fmt.Sprintf("r%03d", i)
	}
	asked := make(chan struct{}, 1)
	r.h.set(func(h *hooks) { h.ready, h.blockers, h.asked = false, blockers, asked })
	done := make(chan control.PrepareReply)
	req := control.PrepareRequest{Base: r.base("c1", 10*time.Second)}
	go func() {
		rep, err := r.m.Prepare(ctx, req)
		if err != nil {
			t.Errorf("prepare: %v", err)
		}
		done <- rep
	}()
	<-asked // the prepare closed admission before its deadline
	// Logical time passes the deadline; the notification makes the
	// waiting prepare look at the clock again.
	r.clk.Advance(11 * time.Second)
	r.m.Notify()
	rep := <-done
	if rep.Phase != control.PhasePreparing || rep.Report.Ready {
		t.Fatalf("reply %+v, want preparing and not ready", rep)
	}
	if len(rep.Report.Blockers) != control.MaxBlockers || rep.Report.BlockerCount != 150 {
		t.Errorf("blockers %d (count %d), want %d of 150", len(rep.Report.Blockers), rep.Report.BlockerCount, control.MaxBlockers)
	}
	if !r.h.isClosed() {
		t.Error("admission reopened after a prepare missed its deadline")
	}
	if st := r.m.Status(); st.Phase != control.PhasePreparing || st.CheckpointID == nil || *st.CheckpointID != "c1" {
		t.Errorf("status %+v, want preparing c1", st)
	}
	r.resume("c1")
	if r.h.isClosed() {
		t.Error("resume did not reopen admission")
	}
}

func TestResumeDuringPrepareMakesItStale(t *testing.T) {
	r := newRig(t)
	r.h.set(func(h *hooks) { h.ready = false })
	asked := make(chan struct{}, 1)
	r.h.set(func(h *hooks) { h.asked = asked })
	errc := make(chan error)
	req := control.PrepareRequest{Base: r.base("c1", time.Hour)}
	go func() {
		_, err := r.m.Prepare(ctx, req)
		errc <- err
	}()
	<-asked // the prepare is preparing and has looked at readiness
	r.resume("c1")
	wantCode(t, <-errc, control.ErrStaleCheckpoint)
}

func TestCloseAdmissionFailureLeavesIdle(t *testing.T) {
	r := newRig(t)
	r.h.set(func(h *hooks) { h.closeErr = errors.New("boom") })
	_, err := r.m.Prepare(ctx, control.PrepareRequest{Base: r.base("c1", time.Minute)})
	wantCode(t, err, control.ErrCheckpoint)
	if p, id := r.m.Phase(); p != control.PhaseIdle || id != "" {
		t.Fatalf("phase %s %q, want idle with no id", p, id)
	}
	// The hooks are told to reopen, whatever they did of the close.
	if diff := cmp.Diff([]string{"open"}, r.h.calls()); diff != "" {
		t.Errorf("hook calls (-want +got):\n%s", diff)
	}
}

func TestCommitRunsOnceAndRetryAwaitsIt(t *testing.T) {
	r := newRig(t)
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	r.h.commit = func(ctx context.Context, req control.CommitRequest) (control.CommitResult, error) {
		entered <- struct{}{}
		<-release
		return control.CommitResult{Manifest: control.Manifest{CheckpointID: req.CheckpointID, RecordCount: 1, RecordsSHA256: "h"}, EpisodeIDs: []string{"r1"}}, nil
	}
	r.prepare("c1")
	// The first caller gives up at once (its context is done); the
	// commit goes on.
	gone, cancel := context.WithCancel(ctx)
	cancel()
	_, err := r.m.Commit(gone, control.CommitRequest{Base: r.base("c1", time.Minute), CheckpointDir: "/ck"})
	wantCode(t, err, control.ErrDeadlineExceeded)
	<-entered
	// A retry with other arguments conflicts even while it runs.
	_, err = r.m.Commit(ctx, control.CommitRequest{Base: r.base("c1", time.Minute), CheckpointDir: "/other"})
	wantCode(t, err, control.ErrCheckpointConflict)
	got := make(chan control.CommitReply)
	go func() {
		rep, err := r.m.Commit(ctx, control.CommitRequest{Base: r.base("c1", time.Minute), CheckpointDir: "/ck"})
		if err != nil {
			t.Errorf("retry: %v", err)
		}
		got <- rep
	}()
	close(release)
	want := control.CommitReply{Phase: control.PhaseCommitted, Manifest: control.Manifest{CheckpointID: "c1", RecordCount: 1, RecordsSHA256: "h"}, EpisodeIDs: []string{"r1"}}
	if diff := cmp.Diff(want, <-got); diff != "" {
		t.Errorf("retry reply (-want +got):\n%s", diff)
	}
	if n := strings.Count(strings.Join(r.h.calls(), "\n"), "commit c1"); n != 1 {
		t.Errorf("commit hook ran %d times, want 1", n)
	}
}

// A failed commit answers its caller with the hook's error, whether the run
// ends before or after the caller starts waiting for it, and is not
// recorded: the retry runs the hook again. (A run that ended before its
// caller waited was once taken for a finished one to step past, and the
// caller started a second run and answered its result instead.)
func TestFailedCommitIsNotRecorded(t *testing.T) {
	inBothOrders(t, func(t *testing.T, r *rig) {
		fail := true
		r.h.commit = func(ctx context.Context, req control.CommitRequest) (control.CommitResult, error) {
			if fail {
				fail = false
				return control.CommitResult{}, errors.New("snapshot failed")
			}
			return control.CommitResult{Manifest: control.Manifest{CheckpointID: req.CheckpointID}}, nil
		}
		r.prepare("c1")
		if _, err := r.commit("c1"); err == nil || !strings.Contains(err.Error(), "snapshot failed") {
			t.Fatalf("commit error %v, want the hook's", err)
		}
		if diff := cmp.Diff([]string{"close", "commit c1"}, r.h.calls()); diff != "" {
			t.Fatalf("hook calls after the failed commit (-want +got):\n%s", diff)
		}
		if r.phase() != control.PhasePrepared {
			t.Fatalf("phase %s after a failed commit, want prepared", r.phase())
		}
		if _, err := r.commit("c1"); err != nil {
			t.Fatalf("retried commit: %v", err)
		}
		if diff := cmp.Diff([]string{"close", "commit c1", "commit c1"}, r.h.calls()); diff != "" {
			t.Errorf("hook calls after the retry (-want +got):\n%s", diff)
		}
	})
}

func TestRestartInScope(t *testing.T) {
	r := newRig(t)
	r.h.set(func(h *hooks) { h.restarts = []string{"r2"} })
	r.prepare("c1")
	_, err := r.commit("c1", ep("r1", 0), ep("r2", 0))
	wantCode(t, err, control.ErrRestartInScope)
	if _, err := r.commit("c1", ep("r1", 0)); err != nil {
		t.Fatalf("commit without the restart: %v", err)
	}
}

// A resume during a commit does not wait for it: it stops the commit's
// writer first, then reopens admission at once while the hook runs on.
func TestResumeDuringACommitStopsItsWriterAndReopensAtOnce(t *testing.T) {
	r := newRig(t)
	release := make(chan struct{})
	entered := make(chan struct{})
	r.h.commit = func(ctx context.Context, req control.CommitRequest) (control.CommitResult, error) {
		close(entered)
		<-release
		r.h.note("commit done")
		return control.CommitResult{}, errors.New("stopped")
	}
	r.prepare("c1")
	gone, cancel := context.WithCancel(ctx)
	cancel()
	_, _ = r.m.Commit(gone, control.CommitRequest{Base: r.base("c1", time.Minute), CheckpointDir: "/ck"})
	<-entered
	if rep := r.resume("c1"); rep.Idempotent || r.phase() != control.PhaseIdle || r.h.isClosed() {
		t.Fatalf("resume during the commit: %+v, phase %s, closed %v; want idle and open", rep, r.phase(), r.h.isClosed())
	}
	want := []string{"close", "commit c1", "stop writer c1", "open", "stop writer c1"}
	if diff := cmp.Diff(want, r.h.calls()); diff != "" {
		t.Errorf("order (-want +got):\n%s", diff)
	}
	_, err := r.commit("c1")
	wantCode(t, err, control.ErrStaleCheckpoint)
	ch := r.m.Changed()
	close(release)
	<-ch
	if r.phase() != control.PhaseIdle {
		t.Errorf("phase %s after the abandoned commit ended, want idle", r.phase())
	}
}

func TestLeaseExpiryResumes(t *testing.T) {
	r := newRig(t)
	_, err := r.m.Prepare(ctx, control.PrepareRequest{Base: r.base("c1", 10*time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	st := r.m.Status()
	if st.LeaseExpiresAt == nil || *st.LeaseExpiresAt != control.UnixSeconds(t0.Add(610*time.Second)) {
		t.Fatalf("lease %v, want deadline + 600 s", st.LeaseExpiresAt)
	}
	// renew moves it to the later of the two.
	rep, err := r.m.Renew(ctx, control.RenewRequest{Base: r.base("c1", 100*time.Second)})
	if err != nil || rep.LeaseExpiresAt != control.UnixSeconds(t0.Add(700*time.Second)) {
		t.Fatalf("renew = %v, %v; want the lease at +700 s", rep, err)
	}
	if _, err := r.m.Renew(ctx, control.RenewRequest{Base: r.base("c1", time.Second)}); err != nil {
		t.Fatal(err)
	}
	r.clk.Advance(699 * time.Second)
	if r.m.Tick() {
		t.Fatal("lease expired early")
	}
	r.clk.Advance(time.Second)
	if !r.m.Tick() {
		t.Fatal("lease did not expire")
	}
	if r.phase() != control.PhaseIdle || r.h.isClosed() {
		t.Fatalf("after expiry: phase %s, admission closed %v", r.phase(), r.h.isClosed())
	}
	ev := r.m.Events()
	if len(ev) != 1 || ev[0].Kind != "lease_expired" || ev[0].CheckpointID != "c1" {
		t.Errorf("events %+v, want one lease_expired of c1", ev)
	}
	_, err = r.m.Commit(ctx, control.CommitRequest{Base: r.base("c1", time.Minute), CheckpointDir: "/ck"})
	wantCode(t, err, control.ErrStaleCheckpoint)
	if st := r.m.Status(); st.LeaseExpiresAt != nil || st.CheckpointID != nil {
		t.Errorf("status after expiry %+v, want no lease and no id", st)
	}
}

func TestOperationsSeeAnExpiredLease(t *testing.T) {
	r := newRig(t)
	r.prepare("c1")
	r.clk.Advance(time.Hour)
	// Nobody ticked; the commit itself notices the lease has passed.
	_, err := r.commit("c1")
	wantCode(t, err, control.ErrStaleCheckpoint)
}

func TestRetireFencesUntilForget(t *testing.T) {
	r := newRig(t)
	if _, err := r.m.Retire(ctx, control.RetireRequest{Base: r.base("c1", time.Minute), EpisodeIDs: []control.EpisodeID{ep("r1", 1), ep("r1", 0)}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		e    control.EpisodeID
		want bool
	}{{ep("r1", 0), true}, {ep("r1", 1), true}, {ep("r1", 2), false}, {ep("r2", 0), false}} {
		if got := r.m.Fenced(tc.e); got != tc.want {
			t.Errorf("Fenced(%v) = %v, want %v", tc.e, got, tc.want)
		}
	}
	if st := r.m.Status(); st.RetiredRollouts != 1 {
		t.Errorf("retired_rollouts %d, want 1", st.RetiredRollouts)
	}
	rep, err := r.m.Forget(ctx, control.ForgetRequest{Base: r.base("c1", time.Minute), RolloutIDs: []string{"r1", "r1"}})
	if err != nil || !cmp.Equal(rep.Forgotten, []string{"r1"}) {
		t.Fatalf("forget = %v, %v", rep, err)
	}
	if r.m.Fenced(ep("r1", 0)) {
		t.Error("still fenced after forget")
	}
}

func TestRetireFailureKeepsTheFence(t *testing.T) {
	r := newRig(t)
	r.h.retire = func(ctx context.Context, eps []control.EpisodeID) error {
		return control.ErrDeadlineExceeded.With("still busy")
	}
	_, err := r.m.Retire(ctx, control.RetireRequest{Base: r.base("c1", time.Minute), EpisodeIDs: []control.EpisodeID{ep("r1", 0)}})
	wantCode(t, err, control.ErrDeadlineExceeded)
	if !r.m.Fenced(ep("r1", 0)) {
		t.Error("a failed retire dropped its fence")
	}
	if st := r.m.Status(); st.Retiring != 0 {
		t.Errorf("retiring %d after the retire returned", st.Retiring)
	}
}

func TestResumedIDsRing(t *testing.T) {
	r := newRig(t)
	for i := 0; i <= control.ResumedMemory; i++ {
		r.resume(fmt.Sprintf("c%d", i))
	}
	// c0 fell out of the ring; c1 is still remembered.
	if rep := r.prepare("c0"); rep.Phase != control.PhasePrepared {
		t.Fatalf("prepare c0: %+v", rep)
	}
	r.resume("c0")
	_, err := r.m.Prepare(ctx, control.PrepareRequest{Base: r.base("c2", time.Minute)})
	wantCode(t, err, control.ErrStaleCheckpoint)
	if rep := r.resume("c2"); !rep.Idempotent {
		t.Error("resume of a remembered id is not idempotent")
	}
	// Remembering c0 again pushed c1 out: it may be prepared again.
	if _, err := r.m.Prepare(ctx, control.PrepareRequest{Base: r.base("c1", time.Minute)}); err != nil {
		t.Errorf("c1 is still remembered after 64 later resumes: %v", err)
	}
}

// A failed restore answers its caller with the hook's error from its one
// run, whether the run ends before or after the caller starts waiting.
func TestRestoreFailureReopensAndClearsTheID(t *testing.T) {
	inBothOrders(t, func(t *testing.T, r *rig) {
		runs := 0
		r.h.restore = func(ctx context.Context, req control.RestoreRequest) (control.RestoreResult, error) {
			if runs++; runs > 1 {
				return control.RestoreResult{}, nil
			}
			return control.RestoreResult{}, control.ErrInvalidCheckpointState.With("no such checkpoint")
		}
		_, err := r.m.Restore(ctx, control.RestoreRequest{Base: r.base("c1", time.Minute), CheckpointDir: "/ck", EpisodeIDs: []control.EpisodeID{}})
		wantCode(t, err, control.ErrInvalidCheckpointState)
		if runs != 1 {
			t.Errorf("the restore hook ran %d times, want once", runs)
		}
		if p, id := r.m.Phase(); p != control.PhaseIdle || id != "" || r.h.isClosed() {
			t.Fatalf("after a failed restore: %s %q closed=%v", p, id, r.h.isClosed())
		}
		r.prepare("c2")
	})
}

func TestRestoreReply(t *testing.T) {
	r := newRig(t)
	rep, err := r.m.Restore(ctx, control.RestoreRequest{Base: r.base("c1", time.Minute), SourceCheckpointID: "ck-0", EpisodeIDs: []control.EpisodeID{ep("b", 0), ep("a", 1)}})
	if err != nil {
		t.Fatal(err)
	}
	want := control.RestoreReply{Phase: control.PhaseRestored, SourceCheckpointID: "ck-0", Restored: []string{"a-a2", "b-a1"}}
	if diff := cmp.Diff(want, rep); diff != "" {
		t.Errorf("restore reply (-want +got):\n%s", diff)
	}
	if !r.h.isClosed() {
		t.Error("restored with admission open; the controller resumes to open it")
	}
	if st := r.m.Status(); st.LeaseExpiresAt == nil {
		t.Error("restore did not arm the lease")
	}
}

func TestOperationsDuringARunningRestore(t *testing.T) {
	r := newRig(t)
	release := make(chan struct{})
	entered := make(chan struct{})
	r.h.restore = func(ctx context.Context, req control.RestoreRequest) (control.RestoreResult, error) {
		close(entered)
		<-release
		r.h.note("restore done")
		return control.RestoreResult{SourceCheckpointID: "src", Restored: []string{"r1-a1"}}, nil
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	_, err := r.m.Restore(gone, control.RestoreRequest{Base: r.base("c1", time.Minute), SourceCheckpointID: "src", EpisodeIDs: []control.EpisodeID{ep("r1", 0)}})
	wantCode(t, err, control.ErrDeadlineExceeded)
	<-entered
	_, err = r.m.Prepare(ctx, control.PrepareRequest{Base: r.base("c1", time.Minute)})
	wantCode(t, err, control.ErrInvalidPhase)
	_, err = r.m.Prepare(ctx, control.PrepareRequest{Base: r.base("c2", time.Minute)})
	wantCode(t, err, control.ErrCheckpointConflict)
	retired := make(chan error)
	go func() {
		_, err := r.m.Retire(ctx, control.RetireRequest{Base: r.base("c1", time.Minute), EpisodeIDs: []control.EpisodeID{ep("r1", 1)}})
		retired <- err
	}()
	close(release)
	if err := <-retired; err != nil {
		t.Fatal(err)
	}
	calls := strings.Join(r.h.calls(), "\n")
	if strings.Index(calls, "restore done") > strings.Index(calls, "retire [r1-a1]") {
		t.Errorf("retire ran before the restore it follows finished:\n%s", calls)
	}
	if r.phase() != control.PhaseRestored {
		t.Errorf("phase %s, want restored", r.phase())
	}
}

// TestCommitWaitEndsAtDeadlineOnTheClock: a commit's caller waits until
// deadline_ts on the machine's clock, not on the wall clock; the commit
// itself goes on, and its reply is kept for a retry.
func TestCommitWaitEndsAtDeadlineOnTheClock(t *testing.T) {
	r := newRig(t)
	release := make(chan struct{})
	entered := make(chan struct{})
	r.h.commit = func(ctx context.Context, req control.CommitRequest) (control.CommitResult, error) {
		close(entered)
		<-release
		return control.CommitResult{Manifest: control.Manifest{CheckpointID: req.CheckpointID, RecordsSHA256: "h"}}, nil
	}
	r.prepare("c1")
	req := control.CommitRequest{Base: r.base("c1", 30*time.Second), CheckpointDir: "/ck"}
	errc := make(chan error, 1)
	go func() {
		_, err := r.m.Commit(ctx, req)
		errc <- err
	}()
	<-entered
	r.clk.WaitPending(1, nil)
	r.clk.Advance(29 * time.Second)
	select {
	case err := <-errc:
		t.Fatalf("the wait ended before the deadline: %v", err)
	default:
	}
	r.clk.Advance(time.Second)
	wantCode(t, <-errc, control.ErrDeadlineExceeded)
	close(release)
	// Resume waits for the run and ends the checkpoint.
	r.resume("c1")
	if p := r.phase(); p != control.PhaseIdle {
		t.Fatalf("phase %s after resume", p)
	}
}

// The machine remembers the last 64 events: the 65th lease expiry drops
// the first, and the 64th dropped none.
func TestTheEventMemoryKeepsTheLast64(t *testing.T) {
	r := newRig(t)
	for i := 1; i <= 65; i++ {
		id := fmt.Sprintf("c%d", i)
		if _, err := r.m.Prepare(ctx, control.PrepareRequest{Base: r.base(id, time.Second)}); err != nil {
			t.Fatal(err)
		}
		r.clk.Advance(time.Hour)
		if !r.m.Tick() {
			t.Fatalf("lease of %s did not expire", id)
		}
		ev := r.m.Events()
		first, n := "c1", i
		if i == 65 {
			first, n = "c2", 64
		}
		if len(ev) != n || ev[0].CheckpointID != first || ev[len(ev)-1].CheckpointID != id {
			t.Fatalf("after %d expiries: %d events, first %s, last %s; want %d, %s, %s", i, len(ev), ev[0].CheckpointID, ev[len(ev)-1].CheckpointID, n, first, id)
		}
	}
}
