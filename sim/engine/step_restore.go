package engine

import (
	"context"
	"maps"
	"slices"
	"sort"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
)

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

// restorePlan is what one restore chose before it acts: the faults it
// arms and the sessions it must install.
type restorePlan struct {
	id    string
	scope []string // nil: all of the checkpoint
	want  []string
	// forkFault is the fork fault armed ("" none).
	forkFault Fault
	stopFail  bool
	// crash crashes the owner at fork crashAt (0: as the first begins,
	// k: after the k-th).
	crash   bool
	crashAt int
}

// restore restores checkpoint id (scope nil: all of it) in the current
// owner, with faults when faults is set, in the simulation's one shape:
// choose, arm, act, check.
func (r *run) restore(id string, scope []string, faults bool) {
	p := r.chooseRestore(id, scope, faults)
	r.armRestore(p)
	incarnation := r.o.Incarnation()
	res, err, crashed := r.actRestore(p)
	if crashed {
		r.fire(FaultCrashRestore)
		r.afterCrash()
		return
	}
	r.checkRestore(p, res, err, incarnation)
}

// chooseRestore draws the restore's faults: at most one fork fault, a
// failed stop, and a crash at one of its forks.
func (r *run) chooseRestore(id string, scope []string, faults bool) restorePlan {
	p := restorePlan{id: id, scope: scope, want: scope}
	if p.want == nil {
		p.want = slices.Sorted(maps.Keys(r.m.ckpts[id].records))
	}
	if !faults {
		return p
	}
	for _, f := range []Fault{FaultForkFail, FaultForkFailAfter} {
		if r.chance(f) && p.forkFault == "" {
			p.forkFault = f
		}
	}
	p.stopFail = r.chance(FaultStopFail)
	p.crash = r.chance(FaultCrashRestore) && len(p.want) > 0
	if p.crash {
		p.crashAt = r.rng.IntN(len(p.want))
	}
	return p
}

// armRestore arms the plan's faults on the fake provider and the crash
// trigger.
func (r *run) armRestore(p restorePlan) {
	if p.stopFail {
		r.fk.FailNext(fake.OpStop, 1)
	}
	switch p.forkFault {
	case FaultForkFail:
		r.fk.FailNext(fake.OpFork, 1)
	case FaultForkFailAfter:
		r.fk.FailAfterEffect(fake.OpFork, 1)
	}
	if p.crash {
		r.proc.arm(crashTrigger(fake.OpFork, p.crashAt))
	}
}

// actRestore runs the owner's Restore.
func (r *run) actRestore(p restorePlan) (res owner.RestoreResult, err error, crashed bool) {
	err, crashed = r.guarded(func(ctx context.Context) error {
		var err error
		res, err = r.o.Restore(ctx, owner.RestoreRequest{CheckpointID: p.id, Sessions: p.scope})
		return err
	})
	r.tracef("restore %s sessions %v (fork fault %q, crash %v): restored %v superseded %v supersede failed %v err %v",
		p.id, p.want, p.forkFault, p.crash, restoredIDs(res), res.Superseded, res.SupersedeFailed, err)
	return res, err, crashed
}

func restoredIDs(res owner.RestoreResult) []string {
	var got []string
	for _, s := range res.Sessions {
		got = append(got, s.SessionID)
	}
	sort.Strings(got)
	return got
}

// checkRestore holds a restore the owner answered to the model: it fails
// only by an injected fork fault and then installs nothing and leaves no
// fork; one that succeeds installed exactly the sessions asked for, each
// holding its record.
func (r *run) checkRestore(p restorePlan, res owner.RestoreResult, err error, incarnation string) {
	id := p.id
	forkInjected := r.injectedNow(fake.OpFork) > 0
	if forkInjected {
		r.fire(p.forkFault)
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
	if got := restoredIDs(res); !slices.Equal(got, p.want) {
		r.violate(AllOrNone, "restore of %s installed %v, want %v", id, got, p.want)
		return
	}
	ck := r.m.ckpts[id]
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
