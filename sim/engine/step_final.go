package engine

import (
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/sandboxowner/owner/snapshotindex"
)

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
	r.finalKeyed()
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
	pooled, _ := r.keyedHeld(nil)
	if sbs := slices.DeleteFunc(r.fk.LiveSandboxIDs(), func(id string) bool { return pooled[id] }); len(sbs) > 0 {
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
	r.afterCloseKeyed(idx)
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

// lostStream, dirGoneStream and startFailStream number the random
// streams of FaultLost, FaultDirGone and FaultStartFailAfter, apart from
// the step's own, so that enabling them changes no other draw of a step.
const (
	lostStream      = 1 << 40
	dirGoneStream   = 2 << 40
	startFailStream = 3 << 40
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
			r.violate(NoEmptyGrading, "append to %s, whose sandbox was deleted behind the owner's back: got %v, want sandbox.ErrLost", sid, err)
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
