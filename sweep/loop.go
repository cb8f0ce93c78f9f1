package sweep

import (
	"context"
	"errors"
	"maps"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/snapshotindex"
)

// Retention is how long each kind waits before a running server's sweep
// removes it.
type Retention struct {
	// Orphans: how long a sandbox or snapshot of the server's must be seen
	// unaccounted for (at two sweeps at least) before it is removed.
	Orphans time.Duration
	// PendingDeletes: how old a tombstone must be before the sweep retries
	// its delete (the operation that wrote it deletes it first).
	PendingDeletes time.Duration
	// Templates: how long a keyed setup's template may go unused (no seed
	// forked it) before the sweep drops it.
	Templates time.Duration
}

// LoopConfig is a running server's sweep.
type LoopConfig struct {
	// Owner is the server's name, Provider its provider, Index its index.
	Owner    string
	Provider provider.Provider
	Index    snapshotindex.Store
	// Quiet runs a pass with the server's control operations held off and
	// says what its sessions hold (owner.Owner.Quiet).
	Quiet func(ctx context.Context, fn func(holdings func() (Held, error)) error) error
	// ExpireTemplates, when set, drops the templates unused since a time
	// (owner.Owner.ExpireTemplates); each pass calls it with the
	// templates' retention.
	ExpireTemplates func(ctx context.Context, before time.Time) (owner.TemplateExpiry, error)
	// Clock times the passes; Interval is their period (zero: no loop).
	Clock     clock.Clock
	Interval  time.Duration
	Retention Retention
	// Parallelism bounds concurrent removals (default 8).
	Parallelism int
	Log         logrus.FieldLogger
	// OnPass, when set, is told of every pass when it ends.
	OnPass func(Pass)
}

// Pass is what one pass of the loop found and did.
type Pass struct {
	At time.Time
	// Orphans is the sweep of unaccounted sandboxes and snapshots (empty
	// when the provider cannot list); Pending the retry of pending deletes.
	Orphans Report
	Pending PendingReport
	// Templates are the templates the pass dropped as unused.
	Templates owner.TemplateExpiry
	// Err is what went wrong (nothing is removed of a kind whose reads
	// failed).
	Err error
}

// KindStatus is what the last pass saw of one kind, and the totals.
type KindStatus struct {
	// Found: unaccounted (or pending) at the last pass; Waiting: of those,
	// not yet due; Deferred: a fork stands on them; Removed and Failed: at
	// the last pass.
	Found, Waiting, Deferred, Removed, Failed int
	// RemovedTotal and FailedTotal count every pass.
	RemovedTotal, FailedTotal uint64
}

// Status is what /health and the metrics report of the loop.
type Status struct {
	Interval  time.Duration
	Retention Retention
	// Runs counts the passes by outcome (ok, error).
	Runs map[string]uint64
	// LastRun is when the last pass began (zero: none yet); LastError its
	// error.
	LastRun   time.Time
	LastError string
	Kinds     map[string]KindStatus
}

// Outcomes of a pass.
const (
	OutcomeOK    = "ok"
	OutcomeError = "error"
)

// Loop sweeps a running server on a period.
type Loop struct {
	cfg   LoopConfig
	aging Aging
	// pass serialises passes: the aging is the loop's memory.
	pass sync.Mutex
	mu   sync.Mutex
	st   Status
}

// NewLoop is a loop on cfg; Run runs it.
func NewLoop(cfg LoopConfig) *Loop {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Log == nil {
		l := logrus.New()
		l.SetOutput(discard{})
		cfg.Log = l
	}
	l := &Loop{cfg: cfg, aging: Aging{After: cfg.Retention.Orphans}}
	l.st = Status{Interval: cfg.Interval, Retention: cfg.Retention, Runs: map[string]uint64{OutcomeOK: 0, OutcomeError: 0}, Kinds: map[string]KindStatus{}}
	for _, k := range Kinds() {
		l.st.Kinds[k] = KindStatus{}
	}
	return l
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// Run passes every Interval on the clock until ctx ends; with no interval
// it returns at once.
func (l *Loop) Run(ctx context.Context) {
	if l.cfg.Interval <= 0 {
		return
	}
	t := l.cfg.Clock.NewTimer(l.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			// Armed before the pass: a pass that ends has the next one
			// waiting on the clock already.
			t.Reset(l.cfg.Interval)
			l.Once(ctx)
		}
	}
}

// Once makes one pass: with the control operations held off, the sweep of
// unaccounted sandboxes and snapshots (those due removed), then the retry
// of the pending deletes old enough.
func (l *Loop) Once(ctx context.Context) Pass {
	l.pass.Lock()
	defer l.pass.Unlock()
	p := Pass{At: l.cfg.Clock.Now()}
	p.Err = l.cfg.Quiet(ctx, func(holdings func() (Held, error)) error {
		var errs []error
		if l.cfg.Provider.Capabilities().Lister != nil {
			var err error
			p.Orphans, err = Run(ctx, Options{Owner: l.cfg.Owner, Provider: l.cfg.Provider, Index: l.cfg.Index, Held: holdings,
				Aging: &l.aging, Now: p.At, Reap: true, Parallelism: l.cfg.Parallelism})
			errs = append(errs, err)
		}
		h, err := holdings()
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		p.Pending, err = RetryPending(ctx, PendingOptions{Provider: l.cfg.Provider, Index: l.cfg.Index, After: l.cfg.Retention.PendingDeletes,
			Now: p.At, InUse: h.Snapshots, Parallelism: l.cfg.Parallelism})
		errs = append(errs, err)
		if l.cfg.ExpireTemplates != nil {
			// After the pending deletes: a template dropped now deletes
			// its snapshot itself, and one a fork stands on waits for a
			// later pass's retry.
			p.Templates, err = l.cfg.ExpireTemplates(ctx, p.At.Add(-l.cfg.Retention.Templates))
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	})
	l.record(p)
	l.logPass(p)
	if l.cfg.OnPass != nil {
		l.cfg.OnPass(p)
	}
	return p
}

func (l *Loop) record(p Pass) {
	o, pd := p.Orphans, p.Pending
	count := func(kind string, ks KindStatus) {
		prev := l.st.Kinds[kind]
		ks.RemovedTotal = prev.RemovedTotal + uint64(ks.Removed)
		ks.FailedTotal = prev.FailedTotal + uint64(ks.Failed)
		l.st.Kinds[kind] = ks
	}
	waiting := map[string]int{}
	for _, w := range o.Waiting {
		waiting[w.Kind]++
	}
	failedOf := func(ids []string, failed map[string]string) (n int) {
		for _, id := range ids {
			if _, ok := failed[id]; ok {
				n++
			}
		}
		return n
	}
	var sbIDs, snapIDs []string
	for _, s := range o.Sandboxes {
		sbIDs = append(sbIDs, s.Handle.SandboxID)
	}
	for _, s := range o.Snapshots {
		snapIDs = append(snapIDs, s.ID)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.st.LastRun, l.st.LastError = p.At, ""
	outcome := OutcomeOK
	if p.Err != nil {
		outcome, l.st.LastError = OutcomeError, p.Err.Error()
	}
	l.st.Runs[outcome]++
	count(KindSandbox, KindStatus{Found: len(o.Sandboxes) + waiting[KindSandbox], Waiting: waiting[KindSandbox],
		Removed: len(o.Stopped), Failed: failedOf(sbIDs, o.Failed)})
	count(KindSnapshot, KindStatus{Found: len(o.Snapshots) + waiting[KindSnapshot], Waiting: waiting[KindSnapshot],
		Deferred: len(o.InUse), Removed: len(o.Deleted), Failed: failedOf(snapIDs, o.Failed)})
	count(KindPendingDelete, KindStatus{Found: pd.Pending, Waiting: len(pd.Waiting), Deferred: len(pd.Deferred),
		Removed: len(pd.Deleted), Failed: len(pd.Failed)})
	tm := p.Templates
	count(KindTemplate, KindStatus{Found: len(tm.Dropped), Waiting: tm.Kept, Deferred: len(tm.Deferred),
		Removed: len(tm.Deleted), Failed: len(tm.Failed)})
}

func (l *Loop) logPass(p Pass) {
	for _, id := range p.Orphans.Stopped {
		l.cfg.Log.WithField("sandbox_id", id).Info("sweep: stopped a sandbox nothing accounted for")
	}
	for _, id := range p.Orphans.Deleted {
		l.cfg.Log.WithField("snapshot_id", id).Info("sweep: deleted a snapshot nothing accounted for")
	}
	for _, k := range p.Templates.Dropped {
		l.cfg.Log.WithField("template", k).Info("sweep: dropped a template unused for its retention")
	}
	for _, id := range p.Pending.Deleted {
		l.cfg.Log.WithField("snapshot_id", id).Info("sweep: deleted a snapshot whose delete was pending")
	}
	if p.Err != nil {
		l.cfg.Log.WithError(p.Err).Warn("sweep: the pass failed in part; the next one retries")
	}
}

// Status is what the passes so far found and did.
func (l *Loop) Status() Status {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.st
	st.Runs, st.Kinds = maps.Clone(l.st.Runs), maps.Clone(l.st.Kinds)
	return st
}
