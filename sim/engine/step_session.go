package engine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"slices"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
)

// --- seed ---

// seedPlan is what one seed chose: the session, its token, and the faults
// it arms.
type seedPlan struct {
	sid       string
	token     string
	setupFail bool
	stopFail  bool
	// startFail: the seed's start (or, with warm pools, the refill its
	// claim begins) makes its sandbox but its call fails. Armed only when
	// a start follows: the session holds no sandbox and the owner does
	// not crash.
	startFail bool
	// crash is where the owner crashes (nil: it does not): after the
	// sandbox started, before setup returned.
	crash *trigger
}

// opSeed is a seed in the simulation's one shape: choose, arm, act, check.
func (r *run) opSeed() {
	p := r.chooseSeed()
	r.armSeed(p)
	s := r.m.sessions[p.sid]
	sb, ran, err, crashed := r.actSeed(p, s)
	if crashed {
		r.fire(FaultCrashSeed)
		r.afterCrash()
		return
	}
	r.checkSeed(p, s, sb, ran, err)
}

func (r *run) chooseSeed() seedPlan {
	p := seedPlan{sid: r.pickSession(0.2), token: r.token()}
	crash := r.chance(FaultCrashSeed)
	p.setupFail = r.chance(FaultSetupFail)
	p.stopFail = r.chance(FaultStopFail)
	if own := rand.New(rand.NewPCG(uint64(r.seed), startFailStream+uint64(r.step))); !crash && !r.m.sessions[p.sid].live {
		p.startFail = r.chanceOn(FaultStartFailAfter, own)
	}
	if crash {
		// At the start's end, at the token write (before or after it), or
		// at the workdir probe that follows setup.
		p.crash = sample(r.rng, []*trigger{
			{op: fake.OpStart, n: 1, after: true},
			{op: fake.OpWriteFile, n: 1},
			{op: fake.OpWriteFile, n: 1, after: true},
			{op: fake.OpExec, n: 1},
		})
	}
	return p
}

func (r *run) armSeed(p seedPlan) {
	if p.startFail {
		r.fk.FailAfterEffect(fake.OpStart, 1)
	}
	if p.stopFail {
		r.fk.FailNext(fake.OpStop, 1)
	}
	if p.crash != nil {
		r.proc.arm(p.crash)
	}
}

// actSeed runs the owner's StartSessionSandbox; ran tells whether setup ran.
func (r *run) actSeed(p seedPlan, s *sessionState) (sb sandbox.Sandbox, ran bool, err error, crashed bool) {
	err, crashed = r.guarded(func(ctx context.Context) error {
		var err error
		sb, err = r.o.StartSessionSandbox(ctx, p.sid, r.spec(), notesSetup(p.token, p.setupFail, &ran), "")
		return err
	})
	startFail := ""
	if p.startFail {
		startFail = ", start fails after"
	}
	r.tracef("seed %s (live %v, setup fails %v, stop fails %v%s, crash %v): sandbox %s err %v", p.sid, s.live, p.setupFail, p.stopFail, startFail, p.crash != nil, sb.Handle.SandboxID, err)
	return sb, ran, err, crashed
}

// checkSeed holds a seed to the model: a live session's seed is refused
// (a restored one gets its fork, its setup not run again), a failing setup
// fails it, and any other seeds.
func (r *run) checkSeed(p seedPlan, s *sessionState, sb sandbox.Sandbox, ran bool, err error) {
	r.noteStopFault()
	if p.startFail {
		// With warm pools the fault may strike a refill still to come:
		// let the pools' starts end, then disarm what is left.
		if r.cfg.Keyed && !r.poolsIdle() {
			r.violate(Unexpected, "the warm pools' starts never ended")
		}
		r.fk.FailAfterEffect(fake.OpStart, 0)
	}
	startFailed := r.injectedNow(fake.OpStart) > 0
	if startFailed {
		r.fire(FaultStartFailAfter)
	}
	switch {
	case startFailed && err != nil && !errors.Is(err, sandbox.ErrSetup):
		// The seed's own start failed (over OpenSandbox the fault comes
		// back as the server's error, not the fake's): the session holds
		// nothing, and what the start made must be gone (the no-leak
		// check).
		if ran {
			r.violate(Unexpected, "seed of %s whose start failed ran its setup", p.sid)
		}
	case s.live && s.restored:
		if err != nil || !sb.Restored || ran || tokenOf(sb.Data) != s.token {
			r.violate(ExactRestore, "re-seed of restored session %s: restored %v, setup ran %v, token %q (want %q), err %v", p.sid, sb.Restored, ran, tokenOf(sb.Data), s.token, err)
		}
	case s.live:
		if !errors.Is(err, sandbox.ErrExists) {
			r.violate(LiveState, "seed of live session %s: got %v, want sandbox.ErrExists", p.sid, err)
		}
	case p.setupFail:
		r.fire(FaultSetupFail)
		if !errors.Is(err, sandbox.ErrSetup) {
			r.violate(Unexpected, "seed of %s with a failing setup: got %v, want sandbox.ErrSetup", p.sid, err)
		}
	case err != nil:
		r.violate(Unexpected, "seed %s: %v", p.sid, err)
	default:
		*s = sessionState{live: true, token: p.token}
	}
}

// --- append ---

// appendPlan is what one append chose: the session and the line it adds.
type appendPlan struct{ sid, line string }

// opAppend is an append in the simulation's one shape; it arms nothing:
// choose, act, check.
func (r *run) opAppend() {
	p := r.chooseAppend()
	err := r.actAppend(p)
	r.checkAppend(p, err)
}

func (r *run) chooseAppend() appendPlan {
	sid := r.pickSession(0.9)
	r.nextLine++
	return appendPlan{sid: sid, line: fmt.Sprintf("%s-n%d", sid, r.nextLine)}
}

func (r *run) actAppend(p appendPlan) error {
	err := r.o.Do(r.life, p.sid, appendNote(p.line))
	r.tracef("append %q to %s (live %v): %v", p.line, p.sid, r.m.sessions[p.sid].live, err)
	return err
}

// checkAppend holds an append to the model: a session without a sandbox
// refuses it, a live one takes the line.
func (r *run) checkAppend(p appendPlan, err error) {
	s := r.m.sessions[p.sid]
	switch {
	case !s.live:
		if !isNoSandbox(err) {
			r.violate(NoEmptyGrading, "append to %s, which holds no sandbox: got %v, want sandbox.ErrNone", p.sid, err)
		}
	case err != nil:
		r.violate(Unexpected, "append to live session %s: %v", p.sid, err)
	default:
		s.notes = append(s.notes, p.line)
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

// endFaults are the faults of a step that ends a session: a crash at the
// stop that ends it (before or after the stop) and a failed stop.
type endFaults struct {
	crash    *trigger
	stopFail bool
}

func (r *run) chooseEndFaults() (f endFaults) {
	if r.chance(FaultCrashEnd) {
		f.crash = &trigger{op: fake.OpStop, n: 1, after: r.rng.IntN(2) == 0}
	}
	f.stopFail = r.chance(FaultStopFail)
	return f
}

func (r *run) armEndFaults(f endFaults) {
	if f.crash != nil {
		r.proc.arm(f.crash)
	}
	if f.stopFail {
		r.fk.FailNext(fake.OpStop, 1)
	}
}

// verifyPlan is what one verify chose: the session, whether its sandbox is
// lost behind the owner's back first (then nothing else is drawn), the
// faults of its end, and whether the verify is sent again.
type verifyPlan struct {
	sid    string
	lost   bool
	end    endFaults
	resend bool
}

// opVerify is a verify in the simulation's one shape: choose, arm, act,
// check; a resent verify is a second act and check.
func (r *run) opVerify() {
	p := r.chooseVerify()
	if p.lost {
		r.verifyLost(p.sid)
		return
	}
	r.armEndFaults(p.end)
	v, crashed := r.actVerify(p)
	if crashed {
		r.fire(FaultCrashEnd)
		r.afterCrash()
		return
	}
	if r.checkVerify(p, v) && p.resend && !r.m.sessions[p.sid].live {
		r.resendVerify(p.sid)
	}
}

func (r *run) chooseVerify() verifyPlan {
	p := verifyPlan{sid: r.pickSession(0.8)}
	if r.m.sessions[p.sid].live && r.chanceApart(FaultLost) {
		p.lost = true
		return p
	}
	p.end = r.chooseEndFaults()
	p.resend = r.chance(FaultResentVerify)
	return p
}

func (r *run) actVerify(p verifyPlan) (v verdict, crashed bool) {
	s := r.m.sessions[p.sid]
	_, crashed = r.guarded(func(ctx context.Context) error {
		v = r.verify(ctx, p.sid, s.notes)
		return nil
	})
	r.tracef("verify %s (live %v, restored %v, expect %q; stop fails %v, crash %v): refused %v reward %v err %v end %v",
		p.sid, s.live, s.restored, s.notes, p.end.stopFail, p.end.crash != nil, v.refused, v.reward, v.err, v.endErr)
	return v, crashed
}

// checkVerify holds a verify to the model: a session without a sandbox is
// refused, a live one is rewarded 1.0 and ends. It reports whether the
// session's end was applied.
func (r *run) checkVerify(p verifyPlan, v verdict) bool {
	r.noteStopFault()
	s := r.m.sessions[p.sid]
	if !s.live {
		if !v.refused {
			r.violate(NoEmptyGrading, "verify of %s, which holds no sandbox, was not refused (reward %v, err %v)", p.sid, v.reward, v.err)
		}
		return false
	}
	inv := LiveState
	if s.restored {
		inv = ExactRestore
	}
	switch {
	case v.refused || v.err != nil:
		r.violate(inv, "verify of live session %s: refused %v, err %v", p.sid, v.refused, v.err)
		return false
	case v.reward != 1:
		r.violate(inv, "verify of session %s rewarded %v, want 1.0", p.sid, v.reward)
		return false
	}
	return r.settleEnd(p.sid, v.endErr)
}

// resendVerify sends the verify of a session that ended again: it must be
// refused.
func (r *run) resendVerify(sid string) {
	r.fire(FaultResentVerify)
	r.lastVerified = sid
	r.sabotagePoint(atResentVerify)
	again := r.verify(r.life, sid, r.m.sessions[sid].notes)
	r.tracef("verify %s again: refused %v reward %v", sid, again.refused, again.reward)
	if !again.refused {
		r.violate(NoEmptyGrading, "a resent verify of ended session %s was not refused (reward %v, err %v)", sid, again.reward, again.err)
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

// --- close ---

// closePlan is what one close chose: the session and the faults of its
// end.
type closePlan struct {
	sid string
	end endFaults
}

// opClose is an end of a session in the simulation's one shape: choose,
// arm, act, check.
func (r *run) opClose() {
	p := r.chooseClose()
	r.armEndFaults(p.end)
	err, crashed := r.actClose(p)
	if crashed {
		r.fire(FaultCrashEnd)
		r.afterCrash()
		return
	}
	r.checkClose(p, err)
}

func (r *run) chooseClose() closePlan {
	sid := r.pickSession(0.8)
	return closePlan{sid: sid, end: r.chooseEndFaults()}
}

func (r *run) actClose(p closePlan) (err error, crashed bool) {
	err, crashed = r.guarded(func(ctx context.Context) error { return r.o.EndSessionSandbox(ctx, p.sid) })
	r.tracef("close %s (live %v; stop fails %v, crash %v): %v", p.sid, r.m.sessions[p.sid].live, p.end.stopFail, p.end.crash != nil, err)
	return err, crashed
}

// checkClose holds an end to the model: nothing to end is no error, and a
// live session ends unless its stop failed.
func (r *run) checkClose(p closePlan, err error) {
	r.noteStopFault()
	if !r.m.sessions[p.sid].live {
		if err != nil {
			r.violate(Unexpected, "closing %s, which holds no sandbox: %v", p.sid, err)
		}
		return
	}
	r.settleEnd(p.sid, err)
}
