package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/snapshotindex"
)

// op is one kind of workload step, with its weight.
type op struct {
	name   string
	weight int
	do     func(r *run)
}

func ops() []op {
	return []op{
		{"seed", 18, (*run).opSeed},
		{"append", 26, (*run).opAppend},
		{"verify", 9, (*run).opVerify},
		{"close", 4, (*run).opClose},
		{"commit", 12, (*run).opCommit},
		{"recommit", 2, (*run).opRecommit},
		{"restore", 7, (*run).opRestore},
		{"restore-in-place", 2, (*run).opRestoreInPlace},
		{"retire", 3, (*run).opRetire},
		{"release", 6, (*run).opRelease},
		{"advance", 8, (*run).opAdvance},
		{"control", 8, (*run).opControl},
		{"agent-exec", 5, (*run).opAgentExec},
	}
}

func (r *run) doStep() {
	all := ops()
	total := 0
	for _, o := range all {
		total += o.weight
	}
	n := r.rng.IntN(total)
	for _, o := range all {
		if n < o.weight {
			o.do(r)
			return
		}
		n -= o.weight
	}
}

// token draws a fresh seed token.
func (r *run) token() string { return fmt.Sprintf("tok-%016x", r.rng.Uint64()) }

func (r *run) spec() provider.Spec {
	return provider.Spec{Image: "notes", TTLSeconds: r.ttl.Seconds()}
}

// notesSetup is the notes server's setup: it writes a token to .seed_token
// and returns it as session data. fail makes it fail after the write.
func notesSetup(token string, fail bool, ran *bool) sandbox.SetupFunc {
	return func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) (json.RawMessage, error) {
		*ran = true
		if err := p.WriteFile(ctx, sb.Handle, tokenFile, []byte(token)); err != nil {
			return nil, fmt.Errorf("write %s: %w", tokenFile, err)
		}
		if fail {
			return nil, errors.New("setup failed on purpose")
		}
		return json.RawMessage(fmt.Sprintf(`{"seed_token":%q}`, token)), nil
	}
}

// appendNote is the notes server's append_note tool.
func appendNote(line string) sandbox.DoFunc {
	return func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) error {
		old, err := p.ReadFile(ctx, sb.Handle, notesFile)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return p.WriteFile(ctx, sb.Handle, notesFile, append(old, []byte(line+"\n")...))
	}
}

// pickSession picks a session, live ones with probability pLive when some
// are live.
func (r *run) pickSession(pLive float64) string {
	live, absent := r.m.live(), r.m.absent()
	v := r.rng.Float64()
	switch {
	case len(live) > 0 && (v < pLive || len(absent) == 0):
		return sample(r.rng, live)
	case len(absent) > 0:
		return sample(r.rng, absent)
	}
	return sample(r.rng, r.m.ids)
}

// failStop arms a failed stop for the step's first stop call.
func (r *run) failStop() bool {
	if r.chance(FaultStopFail) {
		r.fk.FailNext(fake.OpStop, 1)
		return true
	}
	return false
}

func (r *run) noteStopFault() {
	if r.injectedNow(fake.OpStop) > 0 {
		r.fire(FaultStopFail)
	}
}

// --- seed ---

func (r *run) opSeed() {
	sid := r.pickSession(0.2)
	s := r.m.sessions[sid]
	token := r.token()
	crash := r.chance(FaultCrashSeed)
	setupFail := r.chance(FaultSetupFail)
	stopFail := r.failStop()
	if crash {
		// After the sandbox started, before setup returned: at the start's
		// end, at the token write (before or after it), or at the workdir
		// probe that follows setup.
		trigs := []*trigger{
			{op: fake.OpStart, n: 1, after: true},
			{op: fake.OpWriteFile, n: 1},
			{op: fake.OpWriteFile, n: 1, after: true},
			{op: fake.OpExec, n: 1},
		}
		r.proc.arm(sample(r.rng, trigs))
	}
	ran := false
	var sb sandbox.Sandbox
	err, crashed := r.guarded(func(ctx context.Context) error {
		var err error
		sb, err = r.o.StartSessionSandbox(ctx, sid, r.spec(), notesSetup(token, setupFail, &ran), "")
		return err
	})
	r.tracef("seed %s (live %v, setup fails %v, stop fails %v, crash %v): sandbox %s err %v", sid, s.live, setupFail, stopFail, crash, sb.Handle.SandboxID, err)
	if crashed {
		r.fire(FaultCrashSeed)
		r.afterCrash()
		return
	}
	r.noteStopFault()
	switch {
	case s.live && s.restored:
		// A replacement attempt gets the fork; setup does not run again.
		if err != nil || !sb.Restored || ran || tokenOf(sb.Data) != s.token {
			r.violate(ExactRestore, "re-seed of restored session %s: restored %v, setup ran %v, token %q (want %q), err %v", sid, sb.Restored, ran, tokenOf(sb.Data), s.token, err)
		}
	case s.live:
		if !errors.Is(err, owner.ErrSandboxExists) {
			r.violate(LiveState, "seed of live session %s: got %v, want ErrSandboxExists", sid, err)
		}
	case setupFail:
		r.fire(FaultSetupFail)
		if !errors.Is(err, owner.ErrSetup) {
			r.violate(Unexpected, "seed of %s with a failing setup: got %v, want ErrSetup", sid, err)
		}
	case err != nil:
		r.violate(Unexpected, "seed %s: %v", sid, err)
	default:
		*s = sessionState{live: true, token: token}
	}
}

// --- append ---

func (r *run) opAppend() {
	sid := r.pickSession(0.9)
	s := r.m.sessions[sid]
	r.nextLine++
	line := fmt.Sprintf("%s-n%d", sid, r.nextLine)
	err := r.o.Do(r.life, sid, appendNote(line))
	r.tracef("append %q to %s (live %v): %v", line, sid, s.live, err)
	switch {
	case !s.live:
		if !isNoSandbox(err) {
			r.violate(NoEmptyGrading, "append to %s, which holds no sandbox: got %v, want sandbox.ErrNone", sid, err)
		}
	case err != nil:
		r.violate(Unexpected, "append to live session %s: %v", sid, err)
	default:
		s.notes = append(s.notes, line)
	}
}

// --- verify and close ---

type verdict struct {
	refused bool
	lost    bool // refused as sandbox_lost
	reward  float64
	err     error // reading the notes failed
	endErr  error
}

// verify is the notes server's verify: reward 1.0 when the notes file's
// lines equal expected and the session data's token equals the sandbox's,
// then the session ends. A session without a sandbox is refused.
func (r *run) verify(ctx context.Context, sid string, expected []string) verdict {
	var v verdict
	if _, err := r.o.RequireSessionSandbox(r.life, sid); err != nil {
		if isNoSandbox(err) || isLost(err) {
			v.refused, v.lost = true, isLost(err)
		} else {
			v.err = err
		}
		return v
	}
	var notes []string
	var token, dataToken string
	err := r.o.Do(ctx, sid, func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) error {
		b, err := p.ReadFile(ctx, sb.Handle, notesFile)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		notes = parseNotes(string(b))
		t, err := p.ReadFile(ctx, sb.Handle, tokenFile)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		token, dataToken = string(t), tokenOf(sb.Data)
		return nil
	})
	if isNoSandbox(err) || isLost(err) {
		v.refused, v.lost = true, isLost(err)
		return v
	}
	if err != nil {
		v.err = err
		return v
	}
	if slices.Equal(notes, expected) && token != "" && token == dataToken {
		v.reward = 1
	}
	v.endErr = r.o.EndSessionSandbox(ctx, sid)
	return v
}

// armEndCrash arms a crash at the stop that ends a session.
func (r *run) armEndCrash() bool {
	if !r.chance(FaultCrashEnd) {
		return false
	}
	r.proc.arm(&trigger{op: fake.OpStop, n: 1, after: r.rng.IntN(2) == 0})
	return true
}

func (r *run) opVerify() {
	sid := r.pickSession(0.8)
	s := r.m.sessions[sid]
	if s.live && r.chanceApart(FaultLost) {
		r.verifyLost(sid)
		return
	}
	crash := r.armEndCrash()
	stopFail := r.failStop()
	resend := r.chance(FaultResentVerify)
	var v verdict
	_, crashed := r.guarded(func(ctx context.Context) error {
		v = r.verify(ctx, sid, s.notes)
		return nil
	})
	r.tracef("verify %s (live %v, restored %v, expect %q; stop fails %v, crash %v): refused %v reward %v err %v end %v",
		sid, s.live, s.restored, s.notes, stopFail, crash, v.refused, v.reward, v.err, v.endErr)
	if crashed {
		r.fire(FaultCrashEnd)
		r.afterCrash()
		return
	}
	r.noteStopFault()
	if !s.live {
		if !v.refused {
			r.violate(NoEmptyGrading, "verify of %s, which holds no sandbox, was not refused (reward %v, err %v)", sid, v.reward, v.err)
		}
		return
	}
	inv := LiveState
	if s.restored {
		inv = ExactRestore
	}
	switch {
	case v.refused || v.err != nil:
		r.violate(inv, "verify of live session %s: refused %v, err %v", sid, v.refused, v.err)
		return
	case v.reward != 1:
		r.violate(inv, "verify of session %s rewarded %v, want 1.0", sid, v.reward)
		return
	}
	if !r.settleEnd(sid, v.endErr) {
		return
	}
	if resend && !s.live {
		r.fire(FaultResentVerify)
		r.lastVerified = sid
		r.sabotagePoint(atResentVerify)
		again := r.verify(r.life, sid, s.notes)
		r.tracef("verify %s again: refused %v reward %v", sid, again.refused, again.reward)
		if !again.refused {
			r.violate(NoEmptyGrading, "a resent verify of ended session %s was not refused (reward %v, err %v)", sid, again.reward, again.err)
		}
	}
}

// settleEnd applies the outcome of ending a live session.
func (r *run) settleEnd(sid string, err error) bool {
	s := r.m.sessions[sid]
	switch {
	case err == nil:
		s.live, s.restored = false, false
	case r.injectedNow(fake.OpStop) > 0:
		// The stop failed: the session keeps its sandbox, so that a retry
		// stops it.
	default:
		r.violate(Unexpected, "end of session %s: %v", sid, err)
		return false
	}
	return true
}

func (r *run) opClose() {
	sid := r.pickSession(0.8)
	s := r.m.sessions[sid]
	crash := r.armEndCrash()
	stopFail := r.failStop()
	err, crashed := r.guarded(func(ctx context.Context) error { return r.o.EndSessionSandbox(ctx, sid) })
	r.tracef("close %s (live %v; stop fails %v, crash %v): %v", sid, s.live, stopFail, crash, err)
	if crashed {
		r.fire(FaultCrashEnd)
		r.afterCrash()
		return
	}
	r.noteStopFault()
	if !s.live {
		if err != nil {
			r.violate(Unexpected, "closing %s, which holds no sandbox: %v", sid, err)
		}
		return
	}
	r.settleEnd(sid, err)
}

// --- commit ---

func (r *run) newCheckpointID() string {
	r.nextCkpt++
	return fmt.Sprintf("c%d", r.nextCkpt)
}

func (r *run) opCommit() {
	race := r.chance(FaultRace)
	stop := r.rng.IntN(4) == 0
	drift := r.chance(FaultDrift)
	// At most one snapshot fault per commit, so that each fired fault is
	// known by kind.
	var snapFault Fault
	for _, f := range []Fault{FaultSnapshotFail, FaultSnapshotFailAfter, FaultLatency} {
		if r.chance(f) && snapFault == "" {
			snapFault = f
		}
	}
	var crash Fault
	for _, f := range []Fault{FaultCrashCommit, FaultCrashCommitIndex, FaultCrashPark} {
		if r.chance(f) && crash == "" && snapFault == "" {
			crash = f
		}
	}
	deleteFail := r.chance(FaultDeleteFail)
	stopFail := r.chance(FaultStopFail)
	if race {
		r.raceCommit()
		return
	}

	id := r.newCheckpointID()
	live := r.m.live()
	records := map[string]recordState{}
	for _, sid := range live {
		records[sid] = r.m.recordOf(sid)
	}
	ctx, cancel := context.WithCancel(r.life)
	defer cancel()
	var deadline time.Time
	switch snapFault {
	case FaultSnapshotFail:
		if len(live) > 0 && r.rng.IntN(2) == 0 {
			sb, err := r.o.RequireSessionSandbox(r.life, sample(r.rng, live))
			if err == nil {
				r.fk.FailNextFor(fake.OpSnapshot, sb.Handle.SandboxID, 1)
			}
		} else {
			r.fk.FailNext(fake.OpSnapshot, 1)
		}
	case FaultSnapshotFailAfter:
		r.fk.FailAfterEffect(fake.OpSnapshot, 1)
	case FaultLatency:
		// The round's deadline is on the logical clock: moved past it once
		// the round has armed it (or the commit ended without a round).
		r.fk.HangNext(fake.OpSnapshot, 1)
		deadline = r.clk.Now().Add(50 * time.Millisecond)
		if r.det != nil {
			// Virtual time moves to the deadline once nothing else can run.
			defer r.fk.HangNext(fake.OpSnapshot, 0)
			break
		}
		ended := make(chan struct{})
		moved := make(chan struct{})
		go func() {
			defer close(moved)
			if r.clk.(*clock.Manual).WaitPending(1, ended) {
				r.clk.Set(deadline)
			}
		}()
		defer func() {
			close(ended)
			<-moved
			// A hang no snapshot reached must not hold up a later commit.
			r.fk.HangNext(fake.OpSnapshot, 0)
		}()
	}
	switch {
	case crash == FaultCrashCommit && len(live) > 1:
		k := r.rng.IntN(len(live)) // 0..n-1 snapshots done
		if k == 0 {
			r.proc.arm(&trigger{op: fake.OpSnapshot, n: 1})
		} else {
			r.proc.arm(&trigger{op: fake.OpSnapshot, n: k, after: true})
		}
	case crash == FaultCrashCommitIndex && len(live) > 0:
		r.proc.arm(&trigger{op: fake.OpSnapshot, n: len(live), after: true})
	case crash == FaultCrashPark && stop && r.onStop == owner.OnStopKill && len(live) > 0:
		r.proc.arm(&trigger{op: fake.OpStop, n: 1 + r.rng.IntN(len(live)), after: r.rng.IntN(2) == 0})
	default:
		crash = ""
	}
	if deleteFail {
		r.fk.FailNext(fake.OpDeleteSnapshot, 1)
	}
	if stopFail {
		r.fk.FailNext(fake.OpStop, 1)
	}
	r.pendingCommit = &pendingCommit{id: id, records: records, durable: crash == FaultCrashPark}
	var res owner.CommitResult
	err, crashed := r.guarded(func(context.Context) error {
		var err error
		res, err = r.o.Commit(ctx, owner.CommitRequest{CheckpointID: id, Stop: stop, Deadline: deadline})
		return err
	})
	r.tracef("commit %s of %v (stop %v; snapshot fault %q, crash %q, delete fails %v, stop fails %v): exported %v parked %v park failed %v err %v",
		id, live, stop, snapFault, crash, deleteFail, stopFail, res.Sessions, res.Parked, res.ParkFailed, err)
	if crashed {
		if crash != "" {
			r.fire(crash)
		}
		r.afterCrash()
		return
	}
	r.pendingCommit = nil
	snapInjected := r.injectedNow(fake.OpSnapshot) > 0
	if snapFault == FaultLatency && err != nil {
		// The round may give up at the deadline before the hung snapshot
		// even reached the backend.
		snapInjected = true
	}
	if snapInjected {
		r.fire(snapFault)
	}
	if r.injectedNow(fake.OpDeleteSnapshot) > 0 {
		r.fire(FaultDeleteFail)
	}
	r.noteStopFault()
	if err != nil {
		if !snapInjected {
			r.violate(Unexpected, "commit %s failed without a fault: %v", id, err)
			return
		}
		r.awaitOrphans()
		return
	}
	if snapInjected {
		r.violate(WholeCheckpoints, "commit %s succeeded although one of its snapshots failed (%s)", id, snapFault)
		return
	}
	if !slices.Equal(res.Sessions, live) || len(res.Skipped) > 0 {
		r.violate(WholeCheckpoints, "commit %s exported %v (skipped %v), want %v", id, res.Sessions, res.Skipped, live)
		return
	}
	r.m.ckpts[id] = &checkpointState{id: id, records: records}
	if !r.settlePark(res, stop) {
		return
	}
	if drift {
		r.drift(id)
	}
}

// awaitOrphans waits for the owner to clean up the snapshots of a failed
// round that landed after the round gave up on them (the coordinator hands
// them to the owner, which tombstones and deletes them on its own
// goroutine). A no-op Do on every live session waits out its snapshot in
// flight; then every snapshot nothing accounts for must see its delete.
func (r *run) awaitOrphans() {
	for _, sid := range r.m.live() {
		_ = r.o.Do(r.life, sid, func(context.Context, provider.Provider, sandbox.Sandbox) error { return nil })
	}
	st, ok := r.checkCheckpoints(r.o.Index(), "index")
	if !ok {
		return
	}
	var orphans []string
	for _, id := range r.fk.SnapshotIDs() {
		if len(st.refs[id]) == 0 && !st.tomb[id] {
			orphans = append(orphans, id)
		}
	}
	if len(orphans) == 0 {
		return
	}
	r.calls.expect(fake.OpDeleteSnapshot, orphans)
	for _, id := range orphans {
		if _, ok := r.fk.SnapshotInfo(id); !ok {
			// Deleted between the listing and expect.
			r.calls.observe(fake.OpDeleteSnapshot, id, nil)
		}
	}
	missing := r.waitCalls(30 * time.Second)
	r.tracef("late snapshots of the failed round: %v (not deleted: %v)", orphans, missing)
	if len(missing) > 0 {
		r.violate(NoLeak, "snapshots %v landed after their round gave up and were never deleted", missing)
	}
}

// settlePark applies a stop commit's parking to the model.
func (r *run) settlePark(res owner.CommitResult, stop bool) bool {
	if !stop || r.onStop != owner.OnStopKill {
		if len(res.Parked) > 0 {
			r.violate(LiveState, "a commit parked %v with stop %v, on_stop %s", res.Parked, stop, r.onStop)
			return false
		}
		return true
	}
	for _, sid := range res.Parked {
		r.m.sessions[sid].live, r.m.sessions[sid].restored = false, false
	}
	if len(res.ParkFailed) > 0 && r.injectedNow(fake.OpStop) == 0 {
		r.violate(Unexpected, "parking failed without a fault: %v", res.ParkFailed)
		return false
	}
	if len(res.Parked)+len(res.ParkFailed) != len(res.Sessions) {
		r.violate(LiveState, "a stop commit exported %v but parked %v (failed %v)", res.Sessions, res.Parked, res.ParkFailed)
		return false
	}
	return true
}

// drift moves a session of checkpoint id on, crashes the owner and restores
// the checkpoint: the drift must be gone.
func (r *run) drift(id string) {
	ck := r.m.ckpts[id]
	var moved []string
	for _, sid := range r.m.live() {
		if _, ok := ck.records[sid]; ok {
			moved = append(moved, sid)
		}
	}
	if len(moved) == 0 {
		return
	}
	r.fire(FaultDrift)
	sid := sample(r.rng, moved)
	r.nextLine++
	line := fmt.Sprintf("%s-drift%d", sid, r.nextLine)
	if err := r.o.Do(r.life, sid, appendNote(line)); err != nil {
		r.violate(Unexpected, "drift append to %s: %v", sid, err)
		return
	}
	s := r.m.sessions[sid]
	s.notes = append(s.notes, line)
	r.tracef("drift: %s appended %q after checkpoint %s; crash and restore it", sid, line, id)
	r.crash()
	r.afterCrash()
	if r.broken {
		return
	}
	r.restore(id, nil, false)
}

// recommit retries the commit of a checkpoint that exists: nothing is
// snapshotted again.
func (r *run) opRecommit() {
	ids := r.m.checkpointIDs()
	if len(ids) == 0 {
		return
	}
	id := sample(r.rng, ids)
	before := r.fk.Stats().Calls[fake.OpSnapshot]
	res, err := r.o.Commit(r.life, owner.CommitRequest{CheckpointID: id})
	r.tracef("recommit %s: existing %v sessions %v err %v", id, res.Existing, res.Sessions, err)
	want := slices.Sorted(maps.Keys(r.m.ckpts[id].records))
	switch {
	case err != nil:
		r.violate(Unexpected, "a retried commit of %s failed: %v", id, err)
	case !res.Existing || !slices.Equal(res.Sessions, want):
		r.violate(WholeCheckpoints, "a retried commit of %s: existing %v sessions %v, want the stored %v", id, res.Existing, res.Sessions, want)
	case r.fk.Stats().Calls[fake.OpSnapshot] != before:
		r.violate(WholeCheckpoints, "a retried commit of %s snapshotted again", id)
	}
}

// raceCommit runs a seed and an end concurrently with a commit. The model
// accepts either order for each; the index check then holds the checkpoint
// to what each exported session held.
func (r *run) raceCommit() {
	r.fire(FaultRace)
	id := r.newCheckpointID()
	before := map[string]recordState{}
	for _, sid := range r.m.live() {
		before[sid] = r.m.recordOf(sid)
	}
	seedSid, endSid := "", ""
	if absent := r.m.absent(); len(absent) > 0 {
		seedSid = sample(r.rng, absent)
	}
	if live := r.m.live(); len(live) > 0 {
		endSid = sample(r.rng, live)
	}
	token := r.token()
	type outcome struct {
		which string
		err   error
		res   owner.CommitResult
	}
	out := make(chan outcome, 3)
	n := 1
	ctx := r.life
	r.rt.Go(func() {
		res, err := r.o.Commit(ctx, owner.CommitRequest{CheckpointID: id})
		out <- outcome{"commit", err, res}
	})
	if seedSid != "" {
		n++
		r.rt.Go(func() {
			ran := false
			_, err := r.o.StartSessionSandbox(ctx, seedSid, r.spec(), notesSetup(token, false, &ran), "")
			out <- outcome{which: "seed", err: err}
		})
	}
	if endSid != "" {
		n++
		r.rt.Go(func() { out <- outcome{which: "end", err: r.o.EndSessionSandbox(ctx, endSid)} })
	}
	var commit outcome
	var seedErr, endErr error
	for i := 0; i < n; i++ {
		r.rt.Await(ctx, func() bool { return len(out) > 0 })
		o := <-out
		switch o.which {
		case "commit":
			commit = o
		case "seed":
			seedErr = o.err
		case "end":
			endErr = o.err
		}
	}
	r.tracef("race: commit %s exported %v skipped %v err %v; seed %s: %v; end %s: %v",
		id, commit.res.Sessions, commit.res.Skipped, commit.err, seedSid, seedErr, endSid, endErr)
	if seedErr != nil || endErr != nil {
		r.violate(Unexpected, "a race without faults failed: seed %v, end %v", seedErr, endErr)
		return
	}
	if seedSid != "" {
		*r.m.sessions[seedSid] = sessionState{live: true, token: token}
	}
	if endSid != "" {
		r.m.sessions[endSid].live, r.m.sessions[endSid].restored = false, false
	}
	if commit.err != nil {
		// The coordinator counts a session whose actor stopped before it
		// answered as a failure (actors/doc.go), so an end that wins the
		// race can fail the commit; nothing may be recorded then.
		var ce *owner.CommitError
		if errors.As(commit.err, &ce) && ce.Err == nil && len(ce.Failed) == 1 && ce.Failed[endSid] != "" {
			r.tracef("race: the end of %s failed the commit; nothing recorded", endSid)
			return
		}
		r.violate(Unexpected, "a race without faults failed the commit: %v", commit.err)
		return
	}
	records := map[string]recordState{}
	for _, sid := range commit.res.Sessions {
		switch {
		case sid == seedSid:
			records[sid] = recordState{token: token}
		default:
			rec, ok := before[sid]
			if !ok {
				r.violate(WholeCheckpoints, "commit %s exported %s, which was not live", id, sid)
				return
			}
			records[sid] = rec
		}
	}
	for sid := range before {
		if _, ok := records[sid]; !ok && sid != endSid {
			r.violate(WholeCheckpoints, "commit %s did not export live session %s", id, sid)
			return
		}
	}
	r.m.ckpts[id] = &checkpointState{id: id, records: records}
}

// --- restore ---

// opRestore crashes the owner and restores a checkpoint (or some of its
// sessions) in the fresh one.
func (r *run) opRestore() {
	ids := r.m.checkpointIDs()
	if len(ids) == 0 {
		r.tracef("restore: no checkpoint; crash and restart instead")
		r.crash()
		r.afterCrash()
		return
	}
	id := sample(r.rng, ids)
	var scope []string
	if r.rng.IntN(3) == 0 {
		scope = subset(r.rng, slices.Sorted(maps.Keys(r.m.ckpts[id].records)))
		if len(scope) == 0 {
			scope = nil
		}
	}
	viaControl := r.m.ckpts[id].control && r.rng.IntN(2) == 0
	lost := r.chance(FaultMachineLost)
	r.tracef("restore %s (scope %v, through the control plane %v): crash first", id, scope, viaControl)
	r.crash()
	if r.afterCrashLosing(lost) || r.broken {
		// A lost machine's replacement restored the checkpoint the
		// controller kept, and the others are gone.
		return
	}
	if viaControl {
		r.controlRestore(id, scope)
		return
	}
	r.restore(id, scope, true)
}

// opRestoreInPlace restores sessions of a checkpoint that are not live,
// without a crash.
func (r *run) opRestoreInPlace() {
	ids := r.m.checkpointIDs()
	if len(ids) == 0 {
		return
	}
	id := sample(r.rng, ids)
	var scope []string
	for _, sid := range slices.Sorted(maps.Keys(r.m.ckpts[id].records)) {
		if !r.m.sessions[sid].live {
			scope = append(scope, sid)
		}
	}
	if len(scope) == 0 {
		return
	}
	scope = []string{sample(r.rng, scope)}
	r.restore(id, scope, true)
}

// restore restores checkpoint id (scope nil: all of it) in the current
// owner, with faults when faults is set.
func (r *run) restore(id string, scope []string, faults bool) {
	ck := r.m.ckpts[id]
	want := scope
	if want == nil {
		want = slices.Sorted(maps.Keys(ck.records))
	}
	var forkFault Fault
	crash := false
	if faults {
		for _, f := range []Fault{FaultForkFail, FaultForkFailAfter} {
			if r.chance(f) && forkFault == "" {
				forkFault = f
			}
		}
		r.failStop()
		crash = r.chance(FaultCrashRestore) && len(want) > 0
	}
	switch forkFault {
	case FaultForkFail:
		r.fk.FailNext(fake.OpFork, 1)
	case FaultForkFailAfter:
		r.fk.FailAfterEffect(fake.OpFork, 1)
	}
	if crash {
		k := r.rng.IntN(len(want))
		if k == 0 {
			r.proc.arm(&trigger{op: fake.OpFork, n: 1})
		} else {
			r.proc.arm(&trigger{op: fake.OpFork, n: k, after: true})
		}
	}
	incarnation := r.o.Incarnation()
	var res owner.RestoreResult
	err, crashed := r.guarded(func(ctx context.Context) error {
		var err error
		res, err = r.o.Restore(ctx, owner.RestoreRequest{CheckpointID: id, Sessions: scope})
		return err
	})
	var got []string
	for _, s := range res.Sessions {
		got = append(got, s.SessionID)
	}
	sort.Strings(got)
	r.tracef("restore %s sessions %v (fork fault %q, crash %v): restored %v superseded %v supersede failed %v err %v",
		id, want, forkFault, crash, got, res.Superseded, res.SupersedeFailed, err)
	if crashed {
		r.fire(FaultCrashRestore)
		r.afterCrash()
		return
	}
	forkInjected := r.injectedNow(fake.OpFork) > 0
	if forkInjected {
		r.fire(forkFault)
	}
	r.noteStopFault()
	if err != nil {
		if !forkInjected {
			r.violate(Unexpected, "restore of %s failed without a fault: %v", id, err)
			return
		}
		r.lastRestore = id
		r.sabotagePoint(atFailedRestore)
		r.checkRolledBack(id, incarnation)
		return
	}
	if forkInjected {
		r.violate(AllOrNone, "restore of %s succeeded although a fork failed", id)
		return
	}
	if !slices.Equal(got, want) {
		r.violate(AllOrNone, "restore of %s installed %v, want %v", id, got, want)
		return
	}
	for _, rs := range res.Sessions {
		if !r.checkRestored(ck, rs.SessionID, rs.Sandbox) {
			return
		}
	}
}

// checkRestored checks that a restored session's fork holds exactly its
// record's notes and token, and puts it in the model.
func (r *run) checkRestored(ck *checkpointState, sid string, sb sandbox.Sandbox) bool {
	rec := ck.records[sid]
	files, ok := r.fk.Files(sb.Handle.SandboxID)
	if !ok {
		r.violate(ExactRestore, "the fork %s of restored session %s is not running", sb.Handle.SandboxID, sid)
		return false
	}
	notes, tok := contentOf(files, sb.Workdir)
	if !slices.Equal(notes, rec.notes) || tok != rec.token || tokenOf(sb.Data) != rec.token {
		r.violate(ExactRestore, "restored session %s holds notes %q token %q data %s, want notes %q token %q",
			sid, notes, tok, sb.Data, rec.notes, rec.token)
		return false
	}
	*r.m.sessions[sid] = sessionState{live: true, notes: append([]string(nil), rec.notes...), token: rec.token, restored: true}
	return true
}

// checkRolledBack checks that a failed restore installed nothing and left no
// fork running.
func (r *run) checkRolledBack(id, incarnation string) {
	ids, err := r.o.Sessions()
	if err != nil {
		r.violate(Unexpected, "owner.Sessions: %v", err)
		return
	}
	if want := r.m.live(); !slices.Equal(ids, want) {
		r.violate(AllOrNone, "a failed restore of %s left sessions %v, want %v", id, ids, want)
		return
	}
	var forks []string
	for _, sb := range r.fk.LiveSandboxIDs() {
		info, ok := r.fk.Sandbox(sb)
		if ok && info.Metadata[owner.LabelRestore] == id && info.Metadata[owner.LabelIncarnation] == incarnation {
			if _, held := r.heldBy(sb); !held {
				forks = append(forks, sb)
			}
		}
	}
	if len(forks) > 0 {
		r.violate(AllOrNone, "a failed restore of %s left forks %v running", id, forks)
	}
}

// heldBy tells which live session holds sandbox id.
func (r *run) heldBy(id string) (string, bool) {
	for _, sid := range r.m.live() {
		if sb, err := r.o.RequireSessionSandbox(r.life, sid); err == nil && sb.Handle.SandboxID == id {
			return sid, true
		}
	}
	return "", false
}

// --- retire ---

func (r *run) opRetire() {
	sids := subset(r.rng, r.m.ids)
	if len(sids) == 0 {
		sids = []string{r.pickSession(1)}
	}
	stopFail := r.failStop()
	res, err := r.o.Retire(r.life, sids)
	r.tracef("retire %v (stop fails %v): stopped %v failed %v err %v", sids, stopFail, res.Stopped, res.Failed, err)
	r.noteStopFault()
	if err != nil && r.injectedNow(fake.OpStop) == 0 {
		r.violate(Unexpected, "retire without a fault failed: %v", err)
		return
	}
	var want []string
	for _, sid := range sids {
		if r.m.sessions[sid].live {
			if _, failed := res.Failed[sid]; !failed {
				want = append(want, sid)
			}
		}
	}
	sort.Strings(want)
	if !slices.Equal(res.Stopped, want) {
		r.violate(LiveState, "retire of %v stopped %v (failed %v), want %v", sids, res.Stopped, res.Failed, want)
		return
	}
	for _, sid := range res.Stopped {
		r.m.sessions[sid].live, r.m.sessions[sid].restored = false, false
	}
}

// --- release ---

func (r *run) opRelease() {
	all := r.m.checkpointIDs()
	var kept []string
	switch r.rng.IntN(4) {
	case 0: // keep nothing
	case 1:
		kept = all
	default:
		kept = subset(r.rng, all)
	}
	deleteFail := r.chance(FaultDeleteFail)
	crash := r.chance(FaultCrashRelease)
	if deleteFail {
		r.fk.FailNext(fake.OpDeleteSnapshot, 1)
	}
	if crash {
		// Between the tombstones and the first delete, or after k deletes.
		k := r.rng.IntN(3)
		if k == 0 {
			r.proc.arm(&trigger{op: fake.OpDeleteSnapshot, n: 1})
		} else {
			r.proc.arm(&trigger{op: fake.OpDeleteSnapshot, n: k, after: true})
		}
	}
	r.pendingRelease, r.releasing = kept, true
	var res owner.ReleaseResult
	err, crashed := r.guarded(func(ctx context.Context) error {
		var err error
		res, err = r.o.Release(ctx, kept)
		return err
	})
	r.tracef("release keeping %v of %v (delete fails %v, crash %v): dropped %v deleted %v deferred %v failed %v err %v",
		kept, all, deleteFail, crash, res.Dropped, res.Deleted, res.Deferred, res.Failed, err)
	if crashed {
		if crash {
			r.fire(FaultCrashRelease)
		}
		r.afterCrash()
		return
	}
	r.releasing = false
	if r.injectedNow(fake.OpDeleteSnapshot) > 0 {
		r.fire(FaultDeleteFail)
	} else if err != nil {
		r.violate(Unexpected, "release without a fault failed: %v", err)
		return
	}
	keep := toSet(kept)
	var drop []string
	for _, id := range all {
		if !keep[id] {
			drop = append(drop, id)
		}
	}
	// A checkpoint whose directory went and that no check dropped yet
	// goes with the release.
	res.Dropped = slices.DeleteFunc(res.Dropped, func(id string) bool {
		if r.m.gone[id] != nil {
			delete(r.m.gone, id)
			return true
		}
		return false
	})
	if !slices.Equal(res.Dropped, drop) {
		r.violate(WholeCheckpoints, "release keeping %v dropped %v, want %v", kept, res.Dropped, drop)
		return
	}
	for _, id := range drop {
		delete(r.m.ckpts, id)
	}
}

// --- time ---

// opAdvance moves logical time forward by less than half a lease, has the
// owner renew the leases due, and lets the backend reap what expired: no
// live session may lose its sandbox.
func (r *run) opAdvance() {
	d := 10*time.Second + time.Duration(r.rng.Int64N(int64(r.ttl/2-20*time.Second)))
	if gone := rand.New(rand.NewPCG(uint64(r.seed), dirGoneStream+uint64(r.step))); r.chanceOn(FaultDirGone, gone) {
		r.deleteDirs(gone)
	}
	if !r.followDirs(r.clk.Now().Add(d)) {
		return
	}
	now := r.clk.Now()
	var due []string
	held := map[string]string{}
	for _, sid := range r.m.live() {
		sb, err := r.o.RequireSessionSandbox(r.life, sid)
		if err != nil {
			continue // the checks report it
		}
		held[sb.Handle.SandboxID] = sid
		if ttl := sb.Spec.TTL(); ttl > 0 && !sb.ExpiresAt.IsZero() && sb.ExpiresAt.Sub(now) <= ttl/2 {
			due = append(due, sb.Handle.SandboxID)
		}
	}
	r.calls.expect(fake.OpRenew, due)
	if err := r.o.Tick(now); err != nil {
		r.violate(Unexpected, "owner.Tick: %v", err)
		return
	}
	if missing := r.waitCalls(30 * time.Second); len(missing) > 0 {
		r.violate(LiveState, "the leases of %v were due at %v but never renewed", missing, now)
		return
	}
	reaped := r.fk.Reap()
	r.tracef("advance %v: renewed %v, reaped %v", d, due, reaped)
	for _, id := range reaped {
		if sid, ok := held[id]; ok {
			r.violate(LiveState, "the lease of live session %s's sandbox %s ran out", sid, id)
		}
	}
}

// --- the end ---

// final ends every session and releases everything: then the backend must
// hold nothing, and the index on disk must be empty.
func (r *run) final() {
	if r.o == nil && !r.startOwner() {
		return
	}
	ids, err := r.o.Sessions()
	if err != nil {
		r.violate(Unexpected, "owner.Sessions: %v", err)
		return
	}
	for _, sid := range ids {
		if err := r.o.EndSessionSandbox(r.life, sid); err != nil {
			r.violate(Unexpected, "final end of %s: %v", sid, err)
			return
		}
		r.m.sessions[sid].live = false
	}
	res, err := r.o.Release(r.life, nil)
	r.tracef("final: ended %v; release dropped %v deleted %v deferred %v err %v", ids, res.Dropped, res.Deleted, res.Deferred, err)
	if err != nil {
		r.violate(Unexpected, "final release: %v", err)
		return
	}
	if len(res.Deferred) > 0 {
		r.violate(NoLeak, "with every session ended, a release still deferred %v", res.Deferred)
	}
	r.m.ckpts = map[string]*checkpointState{}
	clear(r.m.gone)
	if sbs := r.fk.LiveSandboxIDs(); len(sbs) > 0 {
		r.violate(NoLeak, "every session ended and a release kept nothing, but sandboxes %v run", sbs)
	}
	if snaps := r.fk.SnapshotIDs(); len(snaps) > 0 {
		r.violate(NoLeak, "every session ended and a release kept nothing, but snapshots %v exist", snaps)
	}
	if err := r.o.Close(); err != nil {
		r.violate(Unexpected, "owner.Close: %v", err)
	}
	r.o = nil
	r.stopLife()
	idx, err := r.openIndex()
	if err != nil {
		r.violate(Unexpected, "open the index after Close: %v", err)
		return
	}
	defer idx.Close()
	metas, _ := idx.Checkpoints()
	ts, _ := idx.Tombstones()
	in, _ := idx.Intents("")
	if len(metas)+len(ts)+len(in) > 0 {
		r.violate(NoLeak, "the index on disk still holds %d checkpoints, %d tombstones, %d intents: %s", len(metas), len(ts), len(in), describeIntents(in))
	}
}

func describeIntents(in []snapshotindex.Intent) string {
	var parts []string
	for _, i := range in {
		parts = append(parts, i.Kind+"/"+i.ID)
	}
	return strings.Join(parts, ", ")
}

// lostStream and dirGoneStream number the random streams of FaultLost
// and FaultDirGone, apart from the step's own, so that enabling them
// changes no other draw of a step.
const (
	lostStream    = 1 << 40
	dirGoneStream = 2 << 40
)

// chanceApart is chance on a stream of f's own for this step.
func (r *run) chanceApart(f Fault) bool {
	return r.chanceOn(f, rand.New(rand.NewPCG(uint64(r.seed), lostStream+uint64(r.step))))
}

// chanceOn is chance on rng.
func (r *run) chanceOn(f Fault, rng *rand.Rand) bool {
	if rng.Float64() < r.cfg.Faults[f] {
		r.res.Armed[f]++
		return true
	}
	return false
}

// verifyLost deletes a live session's sandbox behind the owner's back, then
// sends its tool call and its verify: both must be refused as lost (never
// a reward: no empty grading), after which the session is ended.
func (r *run) verifyLost(sid string) {
	s := r.m.sessions[sid]
	sb, ok := r.o.SessionSandbox(r.life, sid)
	if !ok {
		r.violate(LiveState, "live session %s holds no sandbox", sid)
		return
	}
	// The provider itself stops it: the owner does not hear of it.
	if err := r.o.SharedProvider().Stop(r.life, sb.Handle); err != nil {
		r.violate(Unexpected, "delete %s's sandbox behind the owner: %v", sid, err)
		return
	}
	r.fire(FaultLost)
	// On odd steps the verify is the first call to meet the loss.
	if r.step%2 == 0 {
		err := r.o.Do(r.life, sid, appendNote("after the loss"))
		if !isLost(err) {
			r.violate(NoEmptyGrading, "append to %s, whose sandbox was deleted behind the owner's back: got %v, want ErrSandboxLost", sid, err)
		}
	}
	v := r.verify(r.life, sid, s.notes)
	r.tracef("verify %s after its sandbox was deleted behind the owner: refused %v (lost %v) reward %v err %v", sid, v.refused, v.lost, v.reward, v.err)
	if !v.refused || !v.lost {
		r.violate(NoEmptyGrading, "verify of %s, whose sandbox was deleted behind the owner's back, was not refused as lost (reward %v, err %v)", sid, v.reward, v.err)
		return
	}
	r.settleEnd(sid, r.o.EndSessionSandbox(r.life, sid))
}
