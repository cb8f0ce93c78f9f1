package owner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/records"
	"github.com/sandboxowner/owner/retention"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/snapshotindex"
)

// run drives m from inStart to its effDone, performing its effects in
// order, and returns the error effDone carries.
func (o *Owner) run(ctx context.Context, m machine) error {
	in := input(inStart{})
	for {
		var next input
		for _, e := range m.step(in) {
			if d, ok := e.(effDone); ok {
				return d.Err
			}
			if v := o.perform(ctx, e); v != nil {
				next = v
			}
		}
		if next == nil {
			panic(fmt.Sprintf("owner: %T neither asked for anything nor ended", m))
		}
		in = next
	}
}

// perform does one effect and returns the input it gives (nil for an
// effect that gives none).
func (o *Owner) perform(ctx context.Context, e effect) input {
	switch e := e.(type) {
	case effReadCheckpoints:
		all, err := o.index.Checkpoints()
		return inCheckpoints{All: all, Err: err}
	case effReadRefs:
		refs, err := o.index.ReferencedSnapshots()
		return inRefs{Refs: refs, Err: err}
	case effReadTombstones:
		ts, err := o.index.Tombstones()
		return inTombstones{IDs: snapshotIDs(ts), Err: err}
	case effCheckKept:
		for _, id := range e.IDs {
			if _, err := o.index.Checkpoint(id); err != nil {
				return inKept{Missing: id, Err: err}
			}
		}
		return inKept{}
	case effListSnapshots:
		snaps, err := o.caps.Lister.ListSnapshots(ctx)
		return inSnapshots{Snaps: snaps, Err: err}
	case effDrop:
		return inWritten{Err: o.index.Drop(e.IDs, o.tombstones(toSet(e.Tombstones), e.Reason))}
	case effTombstone:
		return inWritten{Err: o.index.AddTombstones(o.tombstones(toSet(e.IDs), e.Reason), e.Clear...)}
	case effDelete:
		return o.deleteSnapshots(ctx, e.IDs)
	case effClear:
		if err := o.index.ClearTombstones(e.IDs); err != nil {
			logs.ForRequest(ctx, o.log).WithError(err).Warn("could not clear tombstones; the next release retries the deletes")
		}
	case effCountDrops:
		o.ret.count(e.Reason, e.N)
	case effLog:
		// A line of a control call names its request.
		logs.ForRequest(ctx, o.log).WithFields(e.Fields).Log(e.Level, e.Msg)
	case effReadIntents:
		ins, err := o.index.Intents("")
		return inIntents{Intents: ins, Err: err}
	case effDeleteIntent:
		return inWritten{Err: o.index.DeleteIntent(e.Key)}
	case effListByTag:
		return inListed{IDs: o.listSnapshotsByTag(ctx, e.RoundTag)}
	case effListMarked:
		return inListed{IDs: o.listSnapshots(ctx, func(name string) bool { return hasMark(name, e.Mark) })}
	case effRoundSettled:
		o.loose.Add(-1)
	case effListSandboxes:
		list, err := o.caps.Lister.ListSandboxes(ctx)
		return inSandboxes{List: list, Err: err}
	case effStopHandles:
		stopped, failed := o.stopHandles(e.Handles)
		return inStopped{Stopped: stopped, Failed: failed}
	case effLookDir:
		return inDir{Gone: retention.Look(o.dirs, e.Dir).Status == retention.Gone}
	case effReadDirRecords:
		return o.dirRecords(e.Req)
	case effImport:
		e.Meta.CommittedAt = o.clk.Now()
		meta, err := o.index.Commit(e.Meta, e.Records)
		return inStored{Meta: meta, Err: err}
	case effFindByDir:
		meta, ok, err := o.index.FindByDir(e.Dir)
		return inFound{Meta: meta, OK: ok, Err: err}
	case effFork:
		forks, at, failed, missing := o.forkAll(ctx, e.CheckpointID, e.Records)
		return inForked{Forks: forks, At: at, Failed: failed, Missing: missing}
	case effStopForks:
		o.ask.discardPrepared()
		o.stopHandles(o.withListedForks(e.CheckpointID, e.Forks))
	case effInstall:
		errs, err := o.ask.install(e.Sessions)
		return inInstalled{Errs: errs, Err: err}
	case effUndoInstall:
		o.undoInstall(e.Sessions, e.Forks)
	case effSuperseded:
		for _, id := range e.IDs {
			o.fates.set(id, sandbox.FateSuperseded)
		}
	case effEnded:
		for _, id := range e.IDs {
			o.fates.set(id, sandbox.FateEnded)
		}
	default:
		return o.performCommit(ctx, e)
	}
	return nil
}

// performCommit does the effects of a commit.
func (o *Owner) performCommit(ctx context.Context, e effect) input {
	switch e := e.(type) {
	case effReadCheckpoint:
		ck, err := o.index.Checkpoint(e.ID)
		return inCheckpoint{Ck: ck, Err: err}
	case effLockWriter:
		lockCtx := ctx
		if e.Unbounded {
			lockCtx = context.Background()
		}
		if err := o.writer.Lock(lockCtx, o.rt); err != nil {
			return inWriter{Err: err}
		}
		return inWriter{Stopped: o.stopped.Has(e.ID), Unstored: o.unstored[e.ID]}
	case effUnlockWriter:
		o.writer.Unlock()
	case effKeepUnstored:
		o.unstored[e.U.meta.ID] = e.U
	case effForgetUnstored:
		delete(o.unstored, e.ID)
	case effReadManifest:
		m, err := records.ReadManifest(o.recordsWriter().FS, e.Dir, o.participant())
		return inManifest{M: m, Err: err}
	case effPublish:
		m, err := o.publishRecords(e.ID, e.Dir, e.Records)
		return inPublished{M: m, Err: err, Now: o.clk.Now()}
	case effListSessions:
		refs, err := o.ask.list()
		return inSessions{Refs: refs, Err: err}
	case effNewRound:
		o.round++
		return inRoundNo{N: o.round, Now: o.clk.Now()}
	case effPutIntent:
		return inWritten{Err: o.index.PutIntent(snapshotindex.Intent{Kind: e.Kind, ID: e.ID, Body: commitIntentBody(e.Tag), At: o.clk.Now()})}
	case effRound:
		o.loose.Add(1)
		rr, err := o.runRound(e.Start)
		return inRound{R: rr, Err: err, Now: o.clk.Now()}
	case effDiscard:
		o.discard(discard{Tag: e.Tag, Taken: e.Taken, Round: true, Reason: e.Reason})
	case effStore:
		meta, err := o.index.Commit(e.U.meta, e.U.records)
		return inStored{Meta: meta, Err: err}
	case effPark:
		parked, failed := o.stopMany(ctx, e.Sessions, messages.StopPark)
		return inParked{Parked: parked, Failed: failed}
	case effSpawnStart:
		ref, rep, err := o.ask.spawnStart(ctx, e.SessionID, e.Limit, e.Msg)
		return inStartReply{Ref: ref, Rep: rep, Err: err}
	case effForget:
		o.ask.forget(e.SessionID, e.PID.(*actor.PID))
	case effTakeTurn:
		return inTurn{Err: o.ctl.Lock(ctx, o.rt)}
	case effGiveTurn:
		o.ctl.Unlock()
	case effRetire:
		stopped, failed := o.stopMany(ctx, e.Sessions, messages.StopRetire)
		return inStopped{Stopped: stopped, Failed: failed}
	default:
		panic(fmt.Sprintf("owner: no shell for %T", e))
	}
	return nil
}

// deleteSnapshots deletes snapshots, at most parallelism at once. One a
// live fork still stands on (the provider refuses it as in use) is neither
// deleted nor failed.
func (o *Owner) deleteSnapshots(ctx context.Context, ids []string) inDeleted {
	snap := o.caps.Snapshotter
	var mu sync.Mutex
	var out inDeleted
	out.Deleted, out.Failed = o.eachOutcome(ctx, len(ids), true, func(i int) (string, error) {
		err := snap.DeleteSnapshot(ctx, ids[i])
		if errors.Is(err, provider.ErrSnapshotInUse) {
			mu.Lock()
			out.InUse = append(out.InUse, ids[i])
			mu.Unlock()
			return "", nil
		}
		return ids[i], err
	})
	slices.Sort(out.InUse)
	return out
}
