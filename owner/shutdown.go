package owner

import (
	"context"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/sandboxowner/owner/internal/timeouts"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/snapshotindex"
)

// Close shuts the owner down: every session's sandbox is stopped (a fresh
// process could not serve them; checkpoints keep their snapshots), the
// actors stop, the rounds intent is dropped when every round is accounted
// for (else the next start looks for their snapshots by its mark), and the
// index is closed cleanly.
func (o *Owner) Close() error {
	var err error
	o.closeOnce.Do(func() {
		if ids, lerr := o.Sessions(); lerr == nil && len(ids) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), timeouts.CloseStops)
			_, failed := o.stopMany(ctx, ids, messages.StopEnd)
			cancel()
			if len(failed) > 0 {
				o.log.WithField("failed", len(failed)).Warn("some sandboxes could not be stopped at shutdown; the next start stops them")
			}
		}
		o.closePools()
		ctx, cancel := context.WithTimeout(context.Background(), timeouts.CloseStops)
		o.closeTemplates(ctx)
		cancel()
		close(o.closed)
		o.cancelBase()
		if o.sup != nil {
			o.poisonAndWait(o.sup)
			o.poisonAndWait(o.coord)
		}
		o.bg.Wait(o.rt)
		o.leaveSystem()
		o.stopWorkers()
		if o.index != nil {
			o.dropRoundsIntent()
			err = o.index.Close()
		}
	})
	return err
}

// dropRoundsIntent drops this incarnation's rounds intent at a clean
// close, unless a round's snapshots are neither recorded nor tombstoned.
func (o *Owner) dropRoundsIntent() {
	if n := o.loose.Load(); n != 0 {
		o.log.WithField("rounds", n).Warn("commit rounds whose snapshots are neither recorded nor tombstoned; the next start looks for them")
		return
	}
	if err := o.index.DeleteIntent(snapshotindex.IntentKey{Kind: intentRounds, ID: o.incarnation}); err != nil {
		o.log.WithError(err).Warn("could not drop this run's rounds intent; the next start drops it")
	}
}

// poisonAndWait stops an actor and waits until it has (its children first).
func (o *Owner) poisonAndWait(pid *actor.PID) {
	f := o.system.Root.PoisonFuture(pid)
	o.rt.Await(context.Background(), func() bool {
		_, alive := o.system.ProcessRegistry.GetLocal(pid.Id)
		return !alive
	})
	_ = f.Wait()
}

// leaveSystem shuts the actor system down if it is the owner's own, and
// stops listening to it.
func (o *Owner) leaveSystem() {
	o.system.EventStream.Unsubscribe(o.deadLetters)
	o.system.EventStream.Unsubscribe(o.orphans)
	if o.cfg.ActorSystem == nil {
		o.system.Shutdown()
	}
}

func (o *Owner) stopWorkers() {
	if o.workers != nil {
		o.workers.Stop()
	}
}

// Abandon drops the owner as a crash would: no sandbox is stopped, no
// session is told, and the index is closed without any further write. For
// tests and the simulation: a fresh owner on the same state_dir and provider
// then recovers. It returns once the index's directory is free for that
// owner, with the index's close error; after a Close or another Abandon it
// does nothing and returns nil.
func (o *Owner) Abandon() error {
	var err error
	o.closeOnce.Do(func() {
		close(o.closed)
		o.cancelBase()
		o.bg.Wait(o.rt)
		if o.cfg.ActorSystem != nil {
			// Gone from the system without a word: no actor runs its stop
			// (a session's would stop its sandbox), as in a crash.
			for _, pid := range append(o.dir.Children(), o.sup, o.coord) {
				o.system.ProcessRegistry.Remove(pid)
			}
		}
		o.leaveSystem()
		o.stopWorkers()
		if o.index != nil {
			err = o.index.Close()
		}
	})
	return err
}
