package participant_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/participant"
	"github.com/sandboxowner/owner/problem"
	"github.com/sandboxowner/owner/resources"
)

// fakeOwner records what the participant asked and answers as scripted.
type fakeOwner struct {
	mu        sync.Mutex
	sessions  []string
	restoreIn []owner.RestoreRequest
	restore   func(owner.RestoreRequest) (owner.RestoreResult, error)
	commitIn  []owner.CommitRequest
	commit    func(owner.CommitRequest) (owner.CommitResult, error)
	release   func([]string) (owner.ReleaseResult, error)
	retention func() (owner.RetentionResult, error)
	retStatus owner.RetentionStatus
	endErr    error
	retireIn  [][]string
	retire    func([]string) (owner.RetireResult, error)
	ended     []string
	stopped   []string
}

func (f *fakeOwner) StopCommit(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = append(f.stopped, id)
}

func (f *fakeOwner) Commit(_ context.Context, req owner.CommitRequest) (owner.CommitResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.commitIn = append(f.commitIn, req)
	if f.commit != nil {
		return f.commit(req)
	}
	return owner.CommitResult{Sessions: req.Scope}, nil
}

func (f *fakeOwner) Restore(_ context.Context, req owner.RestoreRequest) (owner.RestoreResult, error) {
	f.mu.Lock()
	f.restoreIn = append(f.restoreIn, req)
	fn := f.restore
	f.mu.Unlock()
	return fn(req)
}

func (f *fakeOwner) Retire(_ context.Context, ids []string) (owner.RetireResult, error) {
	f.mu.Lock()
	f.retireIn = append(f.retireIn, ids)
	fn := f.retire
	f.mu.Unlock()
	if fn != nil {
		return fn(ids)
	}
	return owner.RetireResult{Stopped: ids}, nil
}

func (f *fakeOwner) CheckRetention(context.Context) (owner.RetentionResult, error) {
	if f.retention != nil {
		return f.retention()
	}
	return owner.RetentionResult{}, nil
}

func (f *fakeOwner) RetentionStatus() owner.RetentionStatus { return f.retStatus }

func (f *fakeOwner) Release(_ context.Context, kept []string) (owner.ReleaseResult, error) {
	if f.release != nil {
		return f.release(kept)
	}
	return owner.ReleaseResult{}, nil
}

func (f *fakeOwner) EndSessionSandbox(_ context.Context, sid string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.endErr != nil {
		return f.endErr
	}
	f.ended = append(f.ended, sid)
	return nil
}

func (f *fakeOwner) Sessions() ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.sessions...), nil
}

var t0 = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)

func newParticipant(f *fakeOwner) (*participant.Participant, *clock.Manual) {
	return newParticipantIn(f, owner.ModeExported, false)
}

func base(clk *clock.Manual, id string) control.Base {
	return control.Base{CheckpointID: id, DeadlineTS: control.UnixSeconds(clk.Now().Add(time.Minute))}
}

func ep(r string, a int) control.EpisodeID { return control.EpisodeID{RolloutID: r, Attempt: a} }

// TestRestoreAsksTheOwnerOnceAndBindsTheNextAttempts: the participant hands
// the checkpoint's dir and the episodes' keys to the owner (which reads the
// index), and binds each restored session to its episode's next attempt.
func TestRestoreAsksTheOwnerOnceAndBindsTheNextAttempts(t *testing.T) {
	f := &fakeOwner{restore: func(req owner.RestoreRequest) (owner.RestoreResult, error) {
		return owner.RestoreResult{CheckpointID: "ck-0", Sessions: []owner.RestoredSession{{SessionID: "s2", Episode: "r2-a1"}, {SessionID: "s1", Episode: "r1"}}}, nil
	}}
	p, clk := newParticipant(f)
	rep, err := p.Machine().Restore(context.Background(), control.RestoreRequest{Base: base(clk, "c1"), CheckpointDir: "/ck", EpisodeIDs: []control.EpisodeID{ep("r2", 1), ep("r1", 0)}})
	if err != nil {
		t.Fatal(err)
	}
	want := control.RestoreReply{Phase: control.PhaseRestored, SourceCheckpointID: "ck-0", Restored: []string{"r1-a1", "r2-a2"}}
	if diff := cmp.Diff(want, rep); diff != "" {
		t.Fatalf("reply (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]owner.RestoreRequest{{CheckpointDir: "/ck", Episodes: []string{"r1", "r2-a1"}}}, f.restoreIn); diff != "" {
		t.Fatalf("owner asked (-want +got):\n%s", diff)
	}
	for sid, want := range map[string]control.EpisodeID{"s1": ep("r1", 1), "s2": ep("r2", 2)} {
		if got, ok := p.BoundEpisode(sid); !ok || got != want {
			t.Errorf("%s bound to %v %v, want %v", sid, got, ok, want)
		}
	}
	// A second restore is refused: the process now serves sessions.
	_, err = p.Machine().Restore(context.Background(), control.RestoreRequest{Base: base(clk, "c2"), CheckpointDir: "/ck", EpisodeIDs: []control.EpisodeID{ep("r1", 0)}})
	if !errors.Is(err, control.ErrCheckpointConflict) {
		t.Fatalf("restore while c1 is active: %v", err)
	}
}

func TestRestoreErrorsAreTyped(t *testing.T) {
	for name, tc := range map[string]struct {
		err  error
		code string
	}{
		"unknown checkpoint": {owner.ErrUnknownCheckpoint, control.ErrInvalidCheckpointState.Code},
		"bad record":         {owner.ErrInvalidRecord, control.ErrInvalidCheckpointState.Code},
		"a fork failed":      {errors.New("fork failed"), participant.CodeRestoreFailed},
	} {
		t.Run(name, func(t *testing.T) {
			f := &fakeOwner{restore: func(owner.RestoreRequest) (owner.RestoreResult, error) {
				return owner.RestoreResult{}, tc.err
			}}
			p, clk := newParticipant(f)
			_, err := p.Machine().Restore(context.Background(), control.RestoreRequest{Base: base(clk, "c1"), CheckpointDir: "/ck", EpisodeIDs: []control.EpisodeID{ep("r1", 0)}})
			if code := codeOf(err); code != tc.code {
				t.Fatalf("error %v has code %q, want %q", err, code, tc.code)
			}
			if _, ok := p.BoundEpisode("s1"); ok {
				t.Fatal("a failed restore bound a session")
			}
		})
	}
	// A process with live sessions restores nothing and asks no owner.
	f := &fakeOwner{sessions: []string{"s1"}}
	p, clk := newParticipant(f)
	_, err := p.Machine().Restore(context.Background(), control.RestoreRequest{Base: base(clk, "c1"), CheckpointDir: "/ck", EpisodeIDs: []control.EpisodeID{}})
	if !errors.Is(err, control.ErrInvalidPhase) || len(f.restoreIn) != 0 {
		t.Fatalf("restore over a live session: %v (owner asked %v)", err, f.restoreIn)
	}
}

func codeOf(err error) string {
	var ce *problem.Error
	var re *problem.Error
	switch {
	case errors.As(err, &ce):
		return ce.Code
	case errors.As(err, &re):
		return re.Code
	}
	return ""
}

// TestRetireFencesAndCutShortBlocksPrepare: a retired attempt's requests
// are refused (its close is not); a session a retire could not stop blocks
// readiness until a retry stops it.
func TestRetireFencesAndCutShortBlocksPrepare(t *testing.T) {
	f := &fakeOwner{}
	p, clk := newParticipant(f)
	ctx := context.Background()
	p.Bind("s1", ep("r1", 0))
	p.Bind("s2", ep("r2", 0))
	f.retire = func(ids []string) (owner.RetireResult, error) {
		return owner.RetireResult{Failed: map[string]string{"s1": "api down"}}, errors.New("1 stop failed")
	}
	if _, err := p.Machine().Retire(ctx, control.RetireRequest{Base: base(clk, "c0"), EpisodeIDs: []control.EpisodeID{ep("r1", 0)}}); codeOf(err) != participant.CodeRetireFailed {
		t.Fatalf("retire with a failed stop: %v", err)
	}
	sess := &resources.Session{ID: "s1", Episode: ep("r1", 0), HasEpisode: true}
	if _, err := p.Admit(ctx, participant.Tool, sess); !errors.Is(err, control.ErrStaleAttempt) {
		t.Fatalf("a tool call of a retired attempt: %v", err)
	}
	leave, err := p.Admit(ctx, participant.Close, sess)
	if err != nil {
		t.Fatalf("close of a retired attempt: %v", err)
	}
	leave()
	next := &resources.Session{ID: "s3", Episode: ep("r1", 1), HasEpisode: true}
	if leave, err := p.Admit(ctx, participant.Seed, next); err != nil {
		t.Fatalf("the next attempt: %v", err)
	} else {
		leave()
	}
	st := p.Machine().Status()
	if diff := cmp.Diff([]string{"r1"}, st.Report.Blockers); diff != "" || st.Report.Ready {
		t.Fatalf("blockers after a cut-short retire (-want +got):\n%s", diff)
	}
	f.retire = nil
	if _, err := p.Machine().Retire(ctx, control.RetireRequest{Base: base(clk, "c0"), EpisodeIDs: []control.EpisodeID{ep("r1", 0)}}); err != nil {
		t.Fatal(err)
	}
	if st := p.Machine().Status(); !st.Report.Ready || st.RetiredSessions != 1 {
		t.Fatalf("after the retry: ready %v, retired sessions %d", st.Report.Ready, st.RetiredSessions)
	}
	if diff := cmp.Diff([][]string{{"s1"}, {"s1"}}, f.retireIn); diff != "" {
		t.Fatalf("owner retired (-want +got):\n%s", diff)
	}
}
