package owner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/internal/timeouts"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
)

// LabelPool is set on the sandboxes a warm pool starts.
const LabelPool = "ng.pool"

// LabelStart numbers each start and fork the owner makes for a seed or a
// warm pool within an incarnation, so that one that failed after the
// provider made its sandbox finds that sandbox by its labels.
const LabelStart = "ng.start"

// PoolConfig keeps started sandboxes ready for seeds: per template (a
// keyed seed's) or per spec (an unkeyed seed's), Size of them, each
// stopped once it waited MaxIdle unclaimed (0: never), at most
// RefillConcurrency starts at once. A pooled sandbox's lease is renewed on
// the owner's ticks as a lent one's is.
type PoolConfig struct {
	Size              int
	MaxIdle           time.Duration
	RefillConcurrency int
}

// PoolStats are the warm pools' counters and sizes.
type PoolStats struct {
	// Hits and Misses count the seeds that claimed a ready sandbox and
	// those that found none.
	Hits, Misses uint64
	// Expired counts the sandboxes stopped unclaimed: after MaxIdle, or
	// when their lease could not be renewed; Failed the starts that
	// failed.
	Expired, Failed uint64
	// Ready are the sandboxes ready now; Starting the pools' starts not
	// yet ended, their clean-up included (0: the pools make no provider
	// call of their own).
	Ready, Starting int
}

// pools is the shell of the warm pools: the book under a mutex, how each
// pool makes a sandbox, and the sandboxes claimed whose seed has not yet
// ended (a sweep keeps them).
type pools struct {
	mu      sync.Mutex
	book    *poolBook
	recipes map[string]poolRecipe
	claimed map[string]bool
	closed  bool
	stats   PoolStats
	// running counts the starts whose goroutine has not yet returned.
	running int
	// onStarted, when set, is told when each of the pools' starts ended
	// (a test's hook).
	onStarted func()
}

// poolRecipe is how a pool makes a sandbox: a fork of Snapshot (a
// template's pool), else a start of Spec.
type poolRecipe struct {
	Spec     provider.Spec
	Snapshot string
	Workdir  string
}

func newPools(c PoolConfig) *pools {
	if c.Size <= 0 {
		return nil
	}
	return &pools{book: newPoolBook(c.Size, c.RefillConcurrency, c.MaxIdle), recipes: map[string]poolRecipe{}, claimed: map[string]bool{}}
}

// poolConfig is c's pools: none without a provider.
func poolConfig(c Config) PoolConfig {
	pc := c.Pool
	if c.Provider == nil {
		pc.Size = 0
	}
	return pc
}

// specKey is the pool key of an unkeyed seed's spec.
func specKey(spec provider.Spec, workdir string) string {
	spec.Metadata, spec.TTLSeconds, spec.ReadyTimeoutSeconds = nil, 0, 0
	b, _ := json.Marshal(struct {
		Spec    provider.Spec
		Workdir string
	}{spec, workdir})
	sum := sha256.Sum256(b)
	return "spec@" + hex.EncodeToString(sum[:6])
}

// PoolStats are the warm pools' counters and sizes (zero without pools).
func (o *Owner) PoolStats() PoolStats {
	p := o.pools
	if p == nil {
		return PoolStats{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stats
	st.Ready, _ = p.book.counts()
	st.Starting = p.running
	return st
}

// fromPool claims a ready sandbox of key's pool (made by r), and has the
// pool refilled behind the claim. ok is false on a miss, and without
// pools.
func (o *Owner) fromPool(key string, r poolRecipe) (l sandbox.Launched, ok bool) {
	p := o.pools
	if p == nil {
		return l, false
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return l, false
	}
	p.recipes[key] = r
	got, hit, starts := p.book.claim(key)
	if hit {
		p.stats.Hits++
		p.claimed[got.Handle.SandboxID] = true
	} else {
		p.stats.Misses++
	}
	p.mu.Unlock()
	o.poolStarts(starts)
	if !hit {
		return l, false
	}
	// The session's lease runs from the last renewal (or the start).
	return sandbox.Launched{Handle: got.Handle, FromSnapshot: r.Snapshot, Workdir: r.Workdir, StartedAt: got.Leased}, true
}

// settleClaim forgets a claimed sandbox once its seed ended: its session
// holds it, or the failed start stopped it.
func (o *Owner) settleClaim(sandboxID string) {
	if p := o.pools; p != nil && sandboxID != "" {
		p.mu.Lock()
		delete(p.claimed, sandboxID)
		p.mu.Unlock()
	}
}

func (o *Owner) poolStarts(starts []poolStart) {
	if len(starts) == 0 {
		return
	}
	p := o.pools
	p.mu.Lock()
	p.running += len(starts)
	p.mu.Unlock()
	for _, s := range starts {
		o.bg.Go(o.rt, func() { o.poolStart(s) })
	}
}

// poolStart makes one sandbox for s's pool and hands it to the book.
func (o *Owner) poolStart(s poolStart) {
	p := o.pools
	p.mu.Lock()
	r, found := p.recipes[s.Key]
	if !found {
		// Drained before the start began: nothing to make.
		_, more := p.book.started(s, pooled{}, false)
		p.mu.Unlock()
		o.poolStarts(more)
		o.poolStartEnded()
		return
	}
	p.mu.Unlock()
	n := o.startLabel()
	at := o.clk.Now()
	spec := o.labelled(r.Spec, "", map[string]string{LabelPool: labelValue(s.Key), LabelStart: n})
	var h provider.Handle
	var err error
	if r.Snapshot != "" {
		h, err = o.caps.Snapshotter.Fork(o.base, spec, r.Snapshot)
	} else {
		h, err = o.prov.Start(o.base, spec)
	}
	p.mu.Lock()
	stop, more := p.book.started(s, pooled{Handle: h, At: at, TTL: spec.TTL(), Leased: at}, err == nil)
	if err != nil {
		p.stats.Failed++
	}
	if p.closed {
		more = nil
	}
	p.mu.Unlock()
	if err != nil {
		o.log.WithError(err).Warn("a warm pool's start failed; the pool refills at its next claim")
		// It may have failed after the provider made the sandbox.
		o.stopUnreported(LabelStart, n)
	}
	if stop {
		o.stopPooled([]pooled{{Handle: h}})
	}
	o.poolStarts(more)
	o.poolStartEnded()
	if p.onStarted != nil {
		p.onStarted()
	}
}

// poolStartEnded counts a pool start's goroutine out, after the starts it
// began were counted in: Starting is 0 only once every start and its
// clean-up ended.
func (o *Owner) poolStartEnded() {
	p := o.pools
	p.mu.Lock()
	p.running--
	p.mu.Unlock()
}

// stopPooled stops sandboxes of the pools no seed will claim.
func (o *Owner) stopPooled(ps []pooled) {
	if len(ps) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeouts.CloseStops)
	defer cancel()
	ids := make([]string, len(ps))
	for i := range ps {
		ids[i] = ps[i].Handle.SandboxID
	}
	_, failed := o.eachOutcome(ctx, len(ps), false, func(i int) (string, error) {
		return ids[i], provider.StopRetrying(ctx, o.prov, ps[i].Handle)
	})
	for id, err := range failed {
		o.log.WithFields(logrus.Fields{"sandbox_id": id, "error": err}).Warn("could not stop a warm pool's sandbox; the next start or sweep stops it")
	}
}

// PoolTick stops the pools' sandboxes that waited the idle time unclaimed
// at now, and renews the leases a third of which has passed (a sandbox
// whose renewal fails is stopped). A loop calls it when the pools have an
// idle time, and Tick with every lease tick; tests call it with their
// clock.
func (o *Owner) PoolTick(now time.Time) {
	p := o.pools
	if p == nil {
		return
	}
	p.mu.Lock()
	gone, renew := p.book.tick(now)
	p.stats.Expired += uint64(len(gone))
	p.mu.Unlock()
	o.stopPooled(gone)
	for _, r := range renew {
		err := o.renewPooled(r.Handle, now.Add(r.TTL))
		p.mu.Lock()
		lapsed, taken := p.book.renewed(r.Handle.SandboxID, now, err == nil)
		if taken {
			p.stats.Expired++
		}
		p.mu.Unlock()
		if taken {
			o.log.WithError(err).WithField("sandbox_id", r.Handle.SandboxID).Warn("could not renew a pooled sandbox's lease: stopped")
			o.stopPooled([]pooled{lapsed})
		}
	}
}

func (o *Owner) renewPooled(h provider.Handle, until time.Time) error {
	l := o.caps.Leaser
	if l == nil {
		return provider.ErrUnsupported
	}
	ctx, cancel := context.WithTimeout(o.base, timeouts.ProviderCall)
	defer cancel()
	return l.Renew(ctx, h, until)
}

// startLabel is the next LabelStart value.
func (o *Owner) startLabel() string { return strconv.FormatUint(o.starts.Add(1), 10) }

// stopUnreported stops this incarnation's sandboxes labelled k=v: a start
// that failed after the provider made its sandbox never reported its id,
// and nothing else would stop it before the next start or sweep.
func (o *Owner) stopUnreported(k, v string) {
	l := o.caps.Lister
	if l == nil {
		return
	}
	ctx, cancel := context.WithTimeout(o.base, timeouts.Listing)
	defer cancel()
	list, err := l.ListSandboxes(ctx)
	if err != nil {
		o.log.WithError(err).Warn("listing sandboxes after a failed start failed; the next start or sweep stops what it made")
		return
	}
	var made []pooled
	for _, s := range list {
		if s.Metadata[k] == v && s.Metadata[LabelIncarnation] == o.incarnation {
			made = append(made, pooled{Handle: s.Handle})
		}
	}
	o.stopPooled(made)
}

// drainPool stops the sandboxes of key's pool (its template was dropped
// or lost: they stand on its snapshot).
func (o *Owner) drainPool(key string) {
	p := o.pools
	if p == nil {
		return
	}
	p.mu.Lock()
	gone := p.book.drain(key)
	delete(p.recipes, key)
	p.mu.Unlock()
	o.stopPooled(gone)
}

// closePools stops every pooled sandbox; a start still in flight stops
// what it made when it ends.
func (o *Owner) closePools() {
	p := o.pools
	if p == nil {
		return
	}
	p.mu.Lock()
	p.closed = true
	gone := p.book.drainAll()
	p.mu.Unlock()
	o.stopPooled(gone)
}

// holdPools adds what the pools hold to h: the sandboxes ready, and those
// claimed by seeds still starting.
func (o *Owner) holdPools(h *Holdings) {
	p := o.pools
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range p.book.sandboxes() {
		h.Sandboxes[id] = true
	}
	for id := range p.claimed {
		h.Sandboxes[id] = true
	}
}

// startPooled is StartSessionSandbox with warm pools: the seed claims a
// started sandbox of its spec's pool, else starts one.
func (o *Owner) startPooled(ctx context.Context, sessionID string, spec provider.Spec, setup sandbox.SetupFunc, workdir string) (sandbox.Sandbox, error) {
	var claimed string
	launch := func(ctx context.Context, labelled provider.Spec) (sandbox.Launched, error) {
		if l, ok := o.fromPool(specKey(spec, workdir), poolRecipe{Spec: spec}); ok {
			claimed = l.Handle.SandboxID
			return l, nil
		}
		return o.startNumbered(ctx, labelled)
	}
	sb, err := o.startSession(ctx, sessionID, spec, setup, workdir, launch)
	o.settleClaim(claimed)
	return sb, err
}
