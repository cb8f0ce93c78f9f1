package participant_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/participant"
	"github.com/sandboxowner/owner/problem"
	"github.com/sandboxowner/owner/resources"
	"github.com/sandboxowner/owner/retention"
	"github.com/sandboxowner/owner/snapshotindex"
)

func newParticipantIn(f *fakeOwner, mode owner.Mode, replay bool) (*participant.Participant, *clock.Manual) {
	clk := clock.NewManual(t0)
	return participant.New(participant.Config{Owner: f, Mode: mode, VerifyReplayable: replay, Instance: "notes", Clock: clk}), clk
}

// TestAdmissionDuringACheckpoint: while a prepared checkpoint holds the gate
// closed, which requests wait for the resume, and which requests are counted
// in flight, by mode, verify mode and route. During the checkpoint a request
// is given an ended context, so waiting shows as admission_closed.
func TestAdmissionDuringACheckpoint(t *testing.T) {
	type want struct{ waits, counted bool }
	kinds := map[participant.Kind]string{participant.Tool: "tool", participant.Seed: "seed", participant.Verify: "verify", participant.Close: "close"}
	cases := []struct {
		mode   owner.Mode
		replay bool
		kind   participant.Kind
		want   want
	}{
		{owner.ModeExported, false, participant.Tool, want{true, true}},
		{owner.ModeExported, false, participant.Seed, want{true, true}},
		{owner.ModeExported, false, participant.Verify, want{true, true}},
		{owner.ModeExported, false, participant.Close, want{true, true}},
		// A replayable verify is neither held nor counted.
		{owner.ModeExported, true, participant.Verify, want{false, false}},
		{owner.ModeExported, true, participant.Tool, want{true, true}},
		// restart_only: only a seed waits; every request is counted.
		{owner.ModeRestartOnly, false, participant.Tool, want{false, true}},
		{owner.ModeRestartOnly, false, participant.Seed, want{true, true}},
		{owner.ModeRestartOnly, false, participant.Verify, want{false, true}},
		{owner.ModeRestartOnly, false, participant.Close, want{false, true}},
		{owner.ModeRestartOnly, true, participant.Verify, want{false, false}},
		{owner.ModeRestartOnly, true, participant.Seed, want{true, true}},
	}
	for _, tc := range cases {
		name := fmt.Sprintf("%s/replay=%v/%s", tc.mode, tc.replay, kinds[tc.kind])
		t.Run(name, func(t *testing.T) {
			p, clk := newParticipantIn(&fakeOwner{}, tc.mode, tc.replay)
			sess := &resources.Session{ID: "s1"}
			leave, err := p.Admit(context.Background(), tc.kind, sess)
			if err != nil {
				t.Fatal(err)
			}
			var got want
			got.counted = p.Gate().Inflight() == 1
			if leave != nil {
				leave()
			}
			if p.Gate().Inflight() != 0 {
				t.Errorf("%d in flight after the request left", p.Gate().Inflight())
			}
			if _, err := p.Machine().Prepare(context.Background(), control.PrepareRequest{Base: base(clk, "c1")}); err != nil {
				t.Fatal(err)
			}
			ended, cancel := context.WithCancel(context.Background())
			cancel()
			leave, err = p.Admit(ended, tc.kind, sess)
			got.waits = errors.Is(err, control.ErrAdmissionClosed)
			if err != nil && !got.waits {
				t.Fatalf("admit: %v", err)
			}
			if leave != nil {
				leave()
			}
			if got != tc.want {
				t.Errorf("waits %v counted %v, want waits %v counted %v", got.waits, got.counted, tc.want.waits, tc.want.counted)
			}
		})
	}
}

// TestSandboxCallsWaitLikeToolCalls: an agent's call on its sandbox is
// named in the readiness report's blockers by its session's capture key,
// and waits for the resume in an exporting server; in restart_only it goes
// straight in.
func TestSandboxCallsWaitLikeToolCalls(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	p, clk := newParticipantIn(&fakeOwner{}, owner.ModeExported, false)
	p.Bind("s1", ep("r1", 2))
	leave, err := p.AdmitSandboxCall(context.Background(), "s1")
	if err != nil {
		t.Fatal(err)
	}
	if st := p.Machine().Status(); !cmp.Equal([]string{"r1-a2"}, st.Report.Blockers) || st.Report.Ready {
		t.Errorf("with a sandbox call in flight: ready %v, blockers %v", st.Report.Ready, st.Report.Blockers)
	}
	leave()
	if _, err := p.Machine().Prepare(context.Background(), control.PrepareRequest{Base: base(clk, "c1")}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.AdmitSandboxCall(ended, "s1"); !errors.Is(err, control.ErrAdmissionClosed) {
		t.Errorf("a sandbox call during a checkpoint: %v, want it to wait", err)
	}

	p, clk = newParticipantIn(&fakeOwner{}, owner.ModeRestartOnly, false)
	if _, err := p.Machine().Prepare(context.Background(), control.PrepareRequest{Base: base(clk, "c1")}); err != nil {
		t.Fatal(err)
	}
	leave, err = p.AdmitSandboxCall(ended, "s1")
	if err != nil {
		t.Fatalf("a sandbox call in restart_only: %v", err)
	}
	leave()
}

// TestBlockersAreCaptureKeys: a request of a session bound to an episode
// blocks a checkpoint under its capture key; one of a session bound to none
// (never exported) blocks nothing.
func TestBlockersAreCaptureKeys(t *testing.T) {
	p, _ := newParticipant(&fakeOwner{})
	ctx := context.Background()
	l1, err := p.Admit(ctx, participant.Tool, &resources.Session{ID: "s1", Episode: ep("r1", 2), HasEpisode: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l1()
	l2, err := p.Admit(ctx, participant.Tool, &resources.Session{ID: "s2"})
	if err != nil {
		t.Fatal(err)
	}
	defer l2()
	want := control.Report{Blockers: []string{"r1-a2"}, BlockerCount: 1, Restarts: []string{}, Counts: map[string]int{"inflight": 1, "sessions": 0}}
	if diff := cmp.Diff(want, p.Machine().Status().Report); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}
}

// TestRestartOnlyReportsRestartsNotBlockers: a restart_only server is ready
// with requests in flight (none of them is in a checkpoint) and names its
// bound episodes as restarts; status says its mode and verify mode.
func TestRestartOnlyReportsRestartsNotBlockers(t *testing.T) {
	p, _ := newParticipantIn(&fakeOwner{}, owner.ModeRestartOnly, true)
	p.Bind("s2", ep("r2", 1))
	p.Bind("s1", ep("r1", 0))
	leave, err := p.Admit(context.Background(), participant.Tool, &resources.Session{ID: "s1", Episode: ep("r1", 0), HasEpisode: true})
	if err != nil {
		t.Fatal(err)
	}
	defer leave()
	st := p.Machine().Status()
	want := control.Report{Ready: true, Blockers: []string{}, Restarts: []string{"r1", "r2-a1"}, Counts: map[string]int{"inflight": 0, "sessions": 2}}
	if diff := cmp.Diff(want, st.Report); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}
	if st.Mode != "restart_only" || st.Verify != "replay" || p.VerifyMode() != "replay" {
		t.Errorf("status mode %q verify %q, VerifyMode %q", st.Mode, st.Verify, p.VerifyMode())
	}
}

// TestCommitScopeAndReply: the commit exports the bound sessions the scope
// names (all of them without a scope), labels each with its episode, and
// answers with the records' capture keys and digest; a restored session the
// scope leaves out and no request claimed is ended, one a request claimed
// stays.
func TestCommitScopeAndReply(t *testing.T) {
	f := &fakeOwner{restore: func(req owner.RestoreRequest) (owner.RestoreResult, error) {
		return owner.RestoreResult{CheckpointID: "c0", Sessions: []owner.RestoredSession{
			{SessionID: "s1", Episode: "r1"}, {SessionID: "s2", Episode: "r2"}, {SessionID: "s3", Episode: "r3"},
		}}, nil
	}}
	f.commit = func(req owner.CommitRequest) (owner.CommitResult, error) {
		return owner.CommitResult{Meta: snapshotindex.CheckpointMeta{ID: req.CheckpointID, RecordCount: len(req.Scope), RecordsSHA256: "d1"}, Sessions: req.Scope}, nil
	}
	p, clk := newParticipant(f)
	ctx := context.Background()
	if _, err := p.Machine().Restore(ctx, control.RestoreRequest{Base: base(clk, "c1"), CheckpointDir: "/ck", EpisodeIDs: []control.EpisodeID{ep("r1", 0), ep("r2", 0), ep("r3", 0)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Machine().Resume(ctx, control.ResumeRequest{Base: base(clk, "c1")}); err != nil {
		t.Fatal(err)
	}
	// s2's agent came back; s3's did not.
	leave, err := p.Admit(ctx, participant.Tool, &resources.Session{ID: "s2", Episode: ep("r2", 1), HasEpisode: true})
	if err != nil {
		t.Fatal(err)
	}
	leave()
	p.Bind("s4", ep("r4", 0))
	if _, err := p.Machine().Prepare(ctx, control.PrepareRequest{Base: base(clk, "c2")}); err != nil {
		t.Fatal(err)
	}
	rep, err := p.Machine().Commit(ctx, control.CommitRequest{Base: base(clk, "c2"), CheckpointDir: "/ck2", EpisodeIDs: []control.EpisodeID{ep("r1", 1), ep("r4", 0)}})
	if err != nil {
		t.Fatal(err)
	}
	want := control.CommitReply{Phase: control.PhaseCommitted, Manifest: control.Manifest{CheckpointID: "c2", RecordCount: 2, RecordsSHA256: "d1"}, EpisodeIDs: []string{"r1-a1", "r4"}}
	if diff := cmp.Diff(want, rep); diff != "" {
		t.Errorf("commit reply (-want +got):\n%s", diff)
	}
	asked := f.commitIn[0]
	asked.Deadline = t0
	if diff := cmp.Diff(owner.CommitRequest{CheckpointID: "c2", CheckpointDir: "/ck2", Scope: []string{"s1", "s4"}, Episodes: map[string]string{"s1": "r1-a1", "s4": "r4"}, Deadline: t0}, asked); diff != "" {
		t.Errorf("owner asked (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"s3"}, f.ended); diff != "" {
		t.Errorf("sessions ended (-want +got):\n%s", diff)
	}
	if _, ok := p.BoundEpisode("s3"); ok {
		t.Error("the ended session is still bound")
	}
	if e, ok := p.BoundEpisode("s2"); !ok || e != ep("r2", 1) {
		t.Errorf("the claimed session s2 is bound to %v %v", e, ok)
	}
}

// TestCommitWithoutScopeOrRecords: no scope exports every bound session; a
// commit that wrote no checkpoint record answers the empty digest; a stop
// commit's parked sessions are named by episode and unbound; a session the
// owner reports that this commit did not label (a retried commit) is named
// by its bound episode.
func TestCommitWithoutScopeOrRecords(t *testing.T) {
	f := &fakeOwner{}
	f.commit = func(req owner.CommitRequest) (owner.CommitResult, error) {
		return owner.CommitResult{Sessions: append([]string{"s9"}, req.Scope...), Parked: []string{"s2"}}, nil
	}
	p, clk := newParticipant(f)
	ctx := context.Background()
	p.Bind("s2", ep("r2", 0))
	p.Bind("s1", ep("r1", 3))
	if _, err := p.Machine().Prepare(ctx, control.PrepareRequest{Base: base(clk, "c1")}); err != nil {
		t.Fatal(err)
	}
	rep, err := p.Machine().Commit(ctx, control.CommitRequest{Base: base(clk, "c1"), CheckpointDir: "/ck", Stop: true})
	if err != nil {
		t.Fatal(err)
	}
	want := control.CommitReply{Phase: control.PhaseCommitted, Manifest: control.Manifest{
		CheckpointID: "c1", RecordsSHA256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
	}, EpisodeIDs: []string{"r1-a3", "r2"}, Parked: []string{"r2"}}
	if diff := cmp.Diff(want, rep); diff != "" {
		t.Errorf("commit reply (-want +got):\n%s", diff)
	}
	if got := f.commitIn[0]; !got.Stop || !cmp.Equal(got.Scope, []string{"s1", "s2"}) {
		t.Errorf("owner asked scope %v stop %v", got.Scope, got.Stop)
	}
	if _, ok := p.BoundEpisode("s2"); ok {
		t.Error("the parked session is still bound")
	}
	if _, ok := p.BoundEpisode("s1"); !ok {
		t.Error("the exported session was unbound")
	}
}

// TestCommitErrorsAreTyped: an index conflict is checkpoint_conflict, any
// other failure commit_failed; a restored session left out whose sandbox
// could not be ended stays bound.
func TestCommitErrorsAreTyped(t *testing.T) {
	for name, tc := range map[string]struct {
		err  error
		code string
	}{
		"conflict": {fmt.Errorf("index: %w", snapshotindex.ErrConflict), control.ErrCheckpointConflict.Code},
		"failure":  {errors.New("disk full"), participant.CodeCommitFailed},
	} {
		t.Run(name, func(t *testing.T) {
			f := &fakeOwner{commit: func(owner.CommitRequest) (owner.CommitResult, error) { return owner.CommitResult{}, tc.err }}
			p, clk := newParticipant(f)
			if _, err := p.Machine().Prepare(context.Background(), control.PrepareRequest{Base: base(clk, "c1")}); err != nil {
				t.Fatal(err)
			}
			_, err := p.Machine().Commit(context.Background(), control.CommitRequest{Base: base(clk, "c1"), CheckpointDir: "/ck"})
			if code := codeOf(err); code != tc.code {
				t.Errorf("error %v has code %q, want %q", err, code, tc.code)
			}
		})
	}

	f := &fakeOwner{endErr: errors.New("api down"), restore: func(owner.RestoreRequest) (owner.RestoreResult, error) {
		return owner.RestoreResult{CheckpointID: "c0", Sessions: []owner.RestoredSession{{SessionID: "s1", Episode: "r1"}}}, nil
	}}
	p, clk := newParticipant(f)
	ctx := context.Background()
	if _, err := p.Machine().Restore(ctx, control.RestoreRequest{Base: base(clk, "c1"), CheckpointDir: "/ck", EpisodeIDs: []control.EpisodeID{ep("r1", 0)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Machine().Resume(ctx, control.ResumeRequest{Base: base(clk, "c1")}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Machine().Prepare(ctx, control.PrepareRequest{Base: base(clk, "c2")}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Machine().Commit(ctx, control.CommitRequest{Base: base(clk, "c2"), CheckpointDir: "/ck", EpisodeIDs: []control.EpisodeID{}}); err != nil {
		t.Fatal(err)
	}
	if _, ok := p.BoundEpisode("s1"); !ok {
		t.Error("a session whose sandbox could not be ended was unbound")
	}
}

// TestRestoreInRestartOnlyRestoresNothing: nothing of a restart_only server
// is in a checkpoint; its restore answers with no sessions and asks no
// owner.
func TestRestoreInRestartOnlyRestoresNothing(t *testing.T) {
	f := &fakeOwner{}
	p, clk := newParticipantIn(f, owner.ModeRestartOnly, false)
	rep, err := p.Machine().Restore(context.Background(), control.RestoreRequest{Base: base(clk, "c1"), CheckpointDir: t.TempDir(), SourceCheckpointID: "c0", EpisodeIDs: []control.EpisodeID{ep("r1", 0)}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(control.RestoreReply{Phase: control.PhaseRestored, SourceCheckpointID: "c0", Restored: []string{}}, rep); diff != "" || len(f.restoreIn) != 0 {
		t.Errorf("reply (-want +got):\n%s\nowner asked %v", diff, f.restoreIn)
	}
}

// TestRestoreInRestartOnlyNeedsItsDirectory: a restart_only restore from a
// checkpoint_dir that is gone, or is no directory, is refused as an invalid
// checkpoint; one that names no directory restores nothing, as one whose
// directory is there.
func TestRestoreInRestartOnlyNeedsItsDirectory(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dir string
		want      error
	}{
		{"gone", filepath.Join(t.TempDir(), "gone"), control.ErrInvalidCheckpointState},
		{"a file", file, control.ErrInvalidCheckpointState},
		{"none named", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, clk := newParticipantIn(&fakeOwner{}, owner.ModeRestartOnly, false)
			_, err := p.Machine().Restore(context.Background(), control.RestoreRequest{Base: base(clk, "c1"), CheckpointDir: tc.dir, SourceCheckpointID: "c0", EpisodeIDs: []control.EpisodeID{}})
			if !errors.Is(err, tc.want) {
				t.Errorf("restore from %q: %v, want %v", tc.dir, err, tc.want)
			}
		})
	}
}

// TestRestoreForgetsSessionsTheOwnerEnded: an exporting server whose owner
// has no live sandbox restores even with sessions still bound (the owner
// ended them on its own); a restart_only server's bound sessions still
// refuse a restore.
func TestRestoreForgetsSessionsTheOwnerEnded(t *testing.T) {
	restored := func(owner.RestoreRequest) (owner.RestoreResult, error) {
		return owner.RestoreResult{CheckpointID: "c0"}, nil
	}
	p, clk := newParticipant(&fakeOwner{restore: restored})
	p.Bind("s1", ep("r1", 0))
	if _, err := p.Machine().Restore(context.Background(), control.RestoreRequest{Base: base(clk, "c1"), CheckpointDir: "/ck", EpisodeIDs: []control.EpisodeID{}}); err != nil {
		t.Fatalf("restore with only ended sessions bound: %v", err)
	}
	if _, ok := p.BoundEpisode("s1"); ok {
		t.Error("the ended session is still bound")
	}

	p, clk = newParticipantIn(&fakeOwner{restore: restored}, owner.ModeRestartOnly, false)
	p.Bind("s1", ep("r1", 0))
	_, err := p.Machine().Restore(context.Background(), control.RestoreRequest{Base: base(clk, "c1"), CheckpointDir: "/ck", EpisodeIDs: []control.EpisodeID{}})
	if !errors.Is(err, control.ErrInvalidPhase) {
		t.Errorf("restore over a bound session in restart_only: %v", err)
	}
}

// TestForgetDropsOnlyTheNamedRollouts: forget ends the retired sessions of
// the rollouts it names; status counts the rest.
func TestForgetDropsOnlyTheNamedRollouts(t *testing.T) {
	f := &fakeOwner{}
	p, clk := newParticipant(f)
	ctx := context.Background()
	p.Bind("s1", ep("r1", 0))
	p.Bind("s2", ep("r2", 0))
	if _, err := p.Machine().Retire(ctx, control.RetireRequest{Base: base(clk, "c0"), EpisodeIDs: []control.EpisodeID{ep("r1", 0), ep("r2", 0)}}); err != nil {
		t.Fatal(err)
	}
	if st := p.Machine().Status(); st.RetiredSessions != 2 {
		t.Fatalf("retired sessions %d, want 2", st.RetiredSessions)
	}
	if _, err := p.Machine().Forget(ctx, control.ForgetRequest{Base: base(clk, "c0"), RolloutIDs: []string{"r1"}}); err != nil {
		t.Fatal(err)
	}
	if st := p.Machine().Status(); st.RetiredSessions != 1 {
		t.Errorf("retired sessions after forgetting r1: %d, want 1", st.RetiredSessions)
	}
	if e, ok := p.BoundEpisode("s2"); !ok || e != ep("r2", 0) {
		t.Errorf("s2 (retired, not forgotten) is bound to %v %v", e, ok)
	}
}

// TestRelease: kept_checkpoint_ids is required and each must be a valid id;
// the owner's lists come back as lists (never null); a failed release names
// what it dropped.
func TestRelease(t *testing.T) {
	ctx := context.Background()
	f := &fakeOwner{}
	p, _ := newParticipant(f)
	if _, err := p.Release(ctx, participant.ReleaseRequest{}); codeOf(err) != control.ErrInvalidRequest.Code {
		t.Errorf("release without kept_checkpoint_ids: %v", err)
	}
	if _, err := p.Release(ctx, participant.ReleaseRequest{KeptCheckpointIDs: &[]string{"c1", "bad/id"}}); codeOf(err) != control.ErrInvalidRequest.Code || !strings.Contains(err.Error(), "kept_checkpoint_ids[1]") {
		t.Errorf("release keeping an invalid id: %v", err)
	}
	var asked []string
	f.release = func(kept []string) (owner.ReleaseResult, error) {
		asked = kept
		return owner.ReleaseResult{Dropped: []string{"c0"}}, nil
	}
	rep, err := p.Release(ctx, participant.ReleaseRequest{KeptCheckpointIDs: &[]string{}})
	if err != nil {
		t.Fatal(err)
	}
	want := participant.ReleaseReply{Kept: []string{}, Dropped: []string{"c0"}, Deleted: []string{}, Deferred: []string{}}
	if diff := cmp.Diff(want, rep); diff != "" || asked == nil {
		t.Errorf("reply (-want +got):\n%s\nowner asked %#v", diff, asked)
	}
	f.release = func([]string) (owner.ReleaseResult, error) {
		return owner.ReleaseResult{Dropped: []string{"c0", "c1"}, Failed: map[string]string{"snap": "busy"}}, errors.New("1 delete failed")
	}
	_, err = p.Release(ctx, participant.ReleaseRequest{KeptCheckpointIDs: &[]string{"c2"}})
	var re *problem.Error
	if !errors.As(err, &re) || re.Code != participant.CodeReleaseFailed || !strings.Contains(re.Detail, "(dropped c0, c1; a retry deletes the rest)") {
		t.Errorf("failed release: %v", err)
	}
}

// TestCheckRetention: the owner's check comes back with lists (never
// null), the directories seen gone and unreadable by checkpoint, and a
// failed check names what it dropped.
func TestCheckRetention(t *testing.T) {
	ctx := context.Background()
	since := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	f := &fakeOwner{retStatus: owner.RetentionStatus{FollowDirs: true}}
	p, _ := newParticipant(f)
	f.retention = func() (owner.RetentionResult, error) {
		return owner.RetentionResult{
			Dropped:    []string{"c0"},
			Pending:    []retention.Pending{{ID: "c1", Dir: "/g/c1", Since: since}},
			Unreadable: []retention.Problem{{ID: "c2", Dir: "/g/c2", Reason: retention.ReasonIO, Detail: "EIO"}},
		}, nil
	}
	rep, err := p.CheckRetention(ctx, participant.CheckRetentionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	at := float64(since.Unix())
	want := participant.CheckRetentionReply{
		FollowDirs: true, Dropped: []string{"c0"}, Deleted: []string{}, Deferred: []string{},
		Pending:    []participant.DirSeen{{CheckpointID: "c1", CheckpointDir: "/g/c1", GoneSince: &at}},
		Unreadable: []participant.DirSeen{{CheckpointID: "c2", CheckpointDir: "/g/c2", Reason: "io_error", Error: "EIO"}},
	}
	if diff := cmp.Diff(want, rep); diff != "" {
		t.Errorf("reply (-want +got):\n%s", diff)
	}
	f.retention = func() (owner.RetentionResult, error) {
		return owner.RetentionResult{Dropped: []string{"c0"}}, errors.New("index closed")
	}
	_, err = p.CheckRetention(ctx, participant.CheckRetentionRequest{})
	var re *problem.Error
	if !errors.As(err, &re) || re.Code != participant.CodeRetentionFailed || !strings.Contains(re.Detail, "(dropped c0; the next check deletes the rest)") {
		t.Errorf("failed check: %v", err)
	}
}

// TestRetireThatCannotWaitCutsShort: a retire whose context ends while the
// session's requests are in flight asks the owner to stop nothing and
// leaves the session cut short: it blocks readiness after its request left,
// until a retry stops it.
func TestRetireThatCannotWaitCutsShort(t *testing.T) {
	f := &fakeOwner{}
	p, clk := newParticipant(f)
	ctx := context.Background()
	p.Bind("s1", ep("r1", 0))
	leave, err := p.Admit(ctx, participant.Tool, &resources.Session{ID: "s1", Episode: ep("r1", 0), HasEpisode: true})
	if err != nil {
		t.Fatal(err)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := p.Machine().Retire(ended, control.RetireRequest{Base: base(clk, "c0"), EpisodeIDs: []control.EpisodeID{ep("r1", 0)}}); err == nil {
		t.Fatal("a retire that could not wait for the session's request succeeded")
	}
	leave()
	if st := p.Machine().Status(); st.Report.Ready || !cmp.Equal([]string{"r1"}, st.Report.Blockers) {
		t.Errorf("after the request left: ready %v, blockers %v; want r1 cut short", st.Report.Ready, st.Report.Blockers)
	}
	if len(f.retireIn) != 0 {
		t.Errorf("the owner was asked to stop %v", f.retireIn)
	}
	if _, err := p.Machine().Retire(ctx, control.RetireRequest{Base: base(clk, "c0"), EpisodeIDs: []control.EpisodeID{ep("r1", 0)}}); err != nil {
		t.Fatal(err)
	}
	if st := p.Machine().Status(); !st.Report.Ready {
		t.Errorf("after the retry: blockers %v", st.Report.Blockers)
	}
}
