package fake

import (
	"context"
	"fmt"
	"hash/fnv"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sched"
)

// Op names one provider operation, for latency, faults, hooks and counters.
type Op string

// The operations the fake counts and can slow down or fail. ListSandboxes and
// ListSnapshots share OpList.
const (
	OpStart          Op = "start"
	OpStop           Op = "stop"
	OpExec           Op = "exec"
	OpWriteFile      Op = "write_file"
	OpReadFile       Op = "read_file"
	OpStatus         Op = "status"
	OpSnapshot       Op = "snapshot"
	OpFork           Op = "fork"
	OpDeleteSnapshot Op = "delete_snapshot"
	OpRenew          Op = "renew"
	OpList           Op = "list"
)

// Call phases reported to the hook.
const (
	PhaseBegin = "begin"
	PhaseEnd   = "end"
)

// DefaultWorkdir is the workdir of a sandbox whose spec names none.
const DefaultWorkdir = "/workspace"

// Options configure a fake provider. The zero value is usable.
type Options struct {
	// Name is what Name() returns and handles carry; default "fake".
	Name string
	// Clock decides lease expiry and timestamps; default clock.Real{}.
	Clock clock.Clock
	// Seed drives the random latency and the probabilistic faults, so a
	// failing run can be replayed.
	Seed int64
	// IDPrefix is put in front of every sandbox and snapshot id, so that two
	// fakes in one test hand out distinct ids.
	IDPrefix string
	// Runtime, when set, is what a hung or delayed call waits through, and
	// latency is then waited on Clock instead of the wall clock: a
	// deterministic scheduler moves both.
	Runtime sched.Runtime
}

// Call is what the hook sees of one provider call, once at PhaseBegin and once
// at PhaseEnd. At the end SandboxID and SnapshotID include the ids the call
// created (the new sandbox of a Start or Fork, the new snapshot of a
// Snapshot), and Err is what the call returned.
type Call struct {
	Op         Op
	SandboxID  string
	SnapshotID string
	Phase      string
	Err        error
}

// Stats are the fake's counters. The maps are copies.
type Stats struct {
	// Calls counts calls made, per op, including ones that failed.
	Calls map[Op]int
	// Failures counts calls that returned an error of any kind (injected,
	// not found, context ended), per op.
	Failures map[Op]int
	// Injected counts faults consumed (fail, fail-after-effect, hang), per op.
	Injected map[Op]int
	// Peak is the most calls of an op that were ever in flight at once.
	Peak map[Op]int
	// InFlight is the calls of an op in flight now.
	InFlight map[Op]int
	// LiveSandboxes and LiveSnapshots count what exists now (expired
	// sandboxes are reaped first).
	LiveSandboxes, LiveSnapshots int
	// Started counts sandboxes made by Start, Forked those made by Fork,
	// Stopped those ended by Stop, Reaped those deleted by lease expiry.
	Started, Forked, Stopped, Reaped int
}

// Provider is the in-memory fake. It implements provider.Provider,
// provider.Snapshotter, provider.Leaser and provider.Lister, and is safe for
// concurrent use. Create it with New.
//
// Its locks are split so that calls about different sandboxes do not queue
// on one another, as they would not on a real backend (a benchmark of the
// owner against the fake must not measure the fake's own lock): the
// sandboxes are sharded by id, the counters are atomic, and the faults and
// latency are read under their lock only once one is set. Where several
// are taken, the order is ctl, then snapMu, then the shards in index order.
type Provider struct {
	name   string
	clock  clock.Clock
	rt     sched.Runtime // nil: wall-clock latency, blocking hangs
	prefix string

	// ctl guards the faults, the latency and their random streams.
	ctl sync.Mutex
	// armed is set while any fault or latency is set, so a call on a fake
	// with none takes no lock for them.
	armed atomic.Bool

	// Separate streams, so that adding latency does not change which calls a
	// probabilistic fault hits.
	faultRNG   *rand.Rand
	latencyRNG *rand.Rand

	latency     map[Op]span
	failNext    map[Op]int
	failNextFor map[target]int
	failProb    map[Op]float64
	failAfter   map[Op]int
	hang        map[Op]int
	hook        atomic.Pointer[func(Call)]

	// snapMu guards snapshots; a Fork holds it (shared) while it makes
	// its sandbox, so that a DeleteSnapshot (exclusive, then every shard)
	// sees every fork standing on the snapshot.
	snapMu    sync.RWMutex
	snapshots map[string]*snapshot
	shards    [shardCount]shard

	nextSandbox, nextSnap atomic.Int64

	counts                           [len(allOps)]opCounts
	totalInFlight, peakTotal         atomic.Int64
	started, forked, stopped, reaped atomic.Int64
}

// shardCount is how many locks the sandboxes are spread over.
const shardCount = 64

// shard is the sandboxes whose ids hash to it.
type shard struct {
	mu        sync.Mutex
	sandboxes map[string]*sandbox
}

// allOps are the ops the fake counts, in the order of Provider.counts.
var allOps = [...]Op{OpStart, OpStop, OpExec, OpWriteFile, OpReadFile, OpStatus, OpSnapshot, OpFork, OpDeleteSnapshot, OpRenew, OpList}

// opCounts are one op's counters.
type opCounts struct {
	calls, failures, injected, peak, inFlight atomic.Int64
}

// countsOf returns op's counters.
func (p *Provider) countsOf(op Op) *opCounts {
	for i, o := range allOps {
		if o == op {
			return &p.counts[i]
		}
	}
	panic(fmt.Sprintf("fake: unknown op %q", op))
}

type sandbox struct {
	id           string
	spec         provider.Spec // a copy; Files nil, Workdir the effective one
	files        map[string]string
	createdAt    time.Time
	expiresAt    time.Time
	fromSnapshot string
}

type snapshot struct {
	info  provider.SnapshotInfo
	spec  provider.Spec // the source sandbox's spec, Workdir the effective one
	files map[string]string
}

type span struct{ min, max time.Duration }

type target struct {
	op Op
	id string
}

var _ provider.Provider = (*Provider)(nil)

// Capabilities: the fake snapshots, leases and lists.
func (p *Provider) Capabilities() provider.Capabilities {
	return provider.Capabilities{Snapshotter: p, Leaser: p, Lister: p}
}

// New returns an empty fake provider.
func New(opts Options) *Provider {
	if opts.Name == "" {
		opts.Name = "fake"
	}
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	seed := uint64(opts.Seed)
	p := &Provider{
		name:        opts.Name,
		clock:       opts.Clock,
		rt:          opts.Runtime,
		prefix:      opts.IDPrefix,
		snapshots:   map[string]*snapshot{},
		faultRNG:    rand.New(rand.NewPCG(seed, 1)),
		latencyRNG:  rand.New(rand.NewPCG(seed, 2)),
		latency:     map[Op]span{},
		failNext:    map[Op]int{},
		failNextFor: map[target]int{},
		failProb:    map[Op]float64{},
		failAfter:   map[Op]int{},
		hang:        map[Op]int{},
	}
	for i := range p.shards {
		p.shards[i].sandboxes = map[string]*sandbox{}
	}
	return p
}

// Name returns the provider's name.
func (p *Provider) Name() string { return p.name }

// --- latency and faults ---

// SetLatency makes every call of op take d (waited with the call's context).
// Zero removes it.
func (p *Provider) SetLatency(op Op, d time.Duration) { p.SetLatencyRange(op, d, d) }

// SetLatencyRange makes every call of op take a duration drawn uniformly from
// [lo, hi] with the seeded RNG. A hi below lo is taken as lo; a zero range
// removes the latency.
func (p *Provider) SetLatencyRange(op Op, lo, hi time.Duration) {
	hi = max(lo, hi)
	p.ctl.Lock()
	defer p.ctl.Unlock()
	defer p.rearmLocked()
	if hi <= 0 {
		delete(p.latency, op)
		return
	}
	p.latency[op] = span{min: lo, max: hi}
}

// FailNext makes the next n calls of op fail with an error wrapping
// provider.ErrInjected, before they have any effect. It replaces any count
// already set; n <= 0 clears it.
func (p *Provider) FailNext(op Op, n int) { setCount(p, p.failNext, op, n) }

// FailNextFor is FailNext for the calls of op about one sandbox or snapshot:
// id matches a call's sandbox, its snapshot, or (for Fork and DeleteSnapshot)
// the sandbox the snapshot was taken from. These are consumed before the
// op-wide FailNext.
func (p *Provider) FailNextFor(op Op, id string, n int) {
	setCount(p, p.failNextFor, target{op: op, id: id}, n)
}

// FailWithProbability makes each call of op fail before its effect with
// probability prob, drawn from the seeded RNG. prob <= 0 clears it.
func (p *Provider) FailWithProbability(op Op, prob float64) {
	p.ctl.Lock()
	defer p.ctl.Unlock()
	defer p.rearmLocked()
	if prob <= 0 {
		delete(p.failProb, op)
		return
	}
	p.failProb[op] = prob
}

// FailAfterEffect makes the next n calls of op do what they do (the sandbox
// is started or forked, the snapshot exists, the stop happened, the file is
// written) and then return an error wrapping provider.ErrInjected, with zero
// results: the caller does not learn the new id. A call whose effect itself
// fails (an unknown sandbox) returns that error and still uses up the fault.
// n <= 0 clears it.
func (p *Provider) FailAfterEffect(op Op, n int) { setCount(p, p.failAfter, op, n) }

// HangNext makes the next n calls of op block until their context ends and
// then return its error, with no effect. n <= 0 clears it.
func (p *Provider) HangNext(op Op, n int) { setCount(p, p.hang, op, n) }

// ClearFaults removes every pending fault. Latency and the hook stay.
func (p *Provider) ClearFaults() {
	p.ctl.Lock()
	defer p.ctl.Unlock()
	defer p.rearmLocked()
	clear(p.failNext)
	clear(p.failNextFor)
	clear(p.failProb)
	clear(p.failAfter)
	clear(p.hang)
}

// SetHook installs fn (nil removes it). It is called without the fake's lock
// held at the begin and end of every provider call, so it may block (to hold
// calls in flight) or call the fake. A call uses the hook installed when it
// began for both phases.
func (p *Provider) SetHook(fn func(Call)) {
	if fn == nil {
		p.hook.Store(nil)
		return
	}
	p.hook.Store(&fn)
}

// rearmLocked sets armed to whether any fault or latency is set.
func (p *Provider) rearmLocked() {
	p.armed.Store(len(p.latency)+len(p.failNext)+len(p.failNextFor)+len(p.failProb)+len(p.failAfter)+len(p.hang) > 0)
}

// setCount sets a fault counter; n <= 0 clears it.
func setCount[K comparable](p *Provider, m map[K]int, k K, n int) {
	p.ctl.Lock()
	defer p.ctl.Unlock()
	defer p.rearmLocked()
	if n <= 0 {
		delete(m, k)
		return
	}
	m[k] = n
}

// take consumes one unit of m[k], reporting whether there was one.
func take[K comparable](m map[K]int, k K) bool {
	if m[k] <= 0 {
		return false
	}
	m[k]--
	if m[k] == 0 {
		delete(m, k)
	}
	return true
}

// --- the call path every operation goes through ---

type fault int

const (
	noFault fault = iota
	hangFault
	failBefore
	failAfter
)

// run counts the call, tells the hook, waits the latency, applies the fault
// chosen for it and performs effect (which takes the lock itself). It never
// holds the lock while waiting or calling the hook.
func (p *Provider) run(ctx context.Context, c *Call, effect func() error) error {
	hook, f, delay := p.enter(c)
	if hook != nil {
		begin := *c
		begin.Phase = PhaseBegin
		hook(begin)
	}
	err := p.perform(ctx, c, f, delay, effect)
	p.exit(c.Op, err)
	if hook != nil {
		end := *c
		end.Phase, end.Err = PhaseEnd, err
		hook(end)
	}
	return err
}

func (p *Provider) perform(ctx context.Context, c *Call, f fault, delay time.Duration, effect func() error) error {
	if err := p.wait(ctx, delay); err != nil {
		return fmt.Errorf("fake: %s%s: %w", c.Op, describe(c), err)
	}
	switch f {
	case hangFault:
		sched.Or(p.rt).Await(ctx, func() bool { return false })
		<-ctx.Done()
		return fmt.Errorf("fake: %s%s: hung until the context ended: %w", c.Op, describe(c), ctx.Err())
	case failBefore:
		return fmt.Errorf("fake: %s%s: %w (before the effect)", c.Op, describe(c), provider.ErrInjected)
	}
	if err := effect(); err != nil {
		return err
	}
	if f == failAfter {
		return fmt.Errorf("fake: %s%s: %w (after the effect)", c.Op, describe(c), provider.ErrInjected)
	}
	return nil
}

// wait sleeps d unless ctx ends first; it reports ctx's error either way, so a
// call whose context is already over has no effect.
func (p *Provider) wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	if rt := p.rt; rt != nil {
		t := p.clock.NewTimer(d)
		defer t.Stop()
		rt.Await(ctx, func() bool { return len(t.C()) > 0 })
		// On a runtime whose Await returns at once (the real one) this
		// select is the wait; after a Det's Await it does not block.
		select {
		case <-t.C():
		case <-ctx.Done():
		}
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	return ctx.Err()
}

func describe(c *Call) string {
	var b strings.Builder
	if c.SandboxID != "" {
		b.WriteString(" sandbox " + c.SandboxID)
	}
	if c.SnapshotID != "" {
		b.WriteString(" snapshot " + c.SnapshotID)
	}
	return b.String()
}

func (p *Provider) enter(c *Call) (func(Call), fault, time.Duration) {
	n := p.countsOf(c.Op)
	n.calls.Add(1)
	raise(&n.peak, n.inFlight.Add(1))
	raise(&p.peakTotal, p.totalInFlight.Add(1))
	var hook func(Call)
	if h := p.hook.Load(); h != nil {
		hook = *h
	}
	if !p.armed.Load() {
		return hook, noFault, 0
	}
	p.ctl.Lock()
	defer p.ctl.Unlock()
	f := p.chooseFaultLocked(c)
	if f != noFault {
		n.injected.Add(1)
	}
	return hook, f, p.delayLocked(c.Op)
}

// raise makes m at least v.
func raise(m *atomic.Int64, v int64) {
	for {
		cur := m.Load()
		if v <= cur || m.CompareAndSwap(cur, v) {
			return
		}
	}
}

func (p *Provider) exit(op Op, err error) {
	n := p.countsOf(op)
	n.inFlight.Add(-1)
	p.totalInFlight.Add(-1)
	if err != nil {
		n.failures.Add(1)
	}
}

// chooseFaultLocked picks at most one fault per call, in a fixed order: hang,
// per-id fail, op-wide fail, probabilistic fail, fail after effect.
func (p *Provider) chooseFaultLocked(c *Call) fault {
	if take(p.hang, c.Op) {
		return hangFault
	}
	if len(p.failNextFor) > 0 {
		ids := []string{c.SandboxID, c.SnapshotID}
		p.snapMu.RLock()
		if s, ok := p.snapshots[c.SnapshotID]; ok {
			ids = append(ids, s.info.SandboxID)
		}
		p.snapMu.RUnlock()
		for _, id := range ids {
			if id != "" && take(p.failNextFor, target{op: c.Op, id: id}) {
				return failBefore
			}
		}
	}
	if take(p.failNext, c.Op) {
		return failBefore
	}
	if prob := p.failProb[c.Op]; prob > 0 && p.faultRNG.Float64() < prob {
		return failBefore
	}
	if take(p.failAfter, c.Op) {
		return failAfter
	}
	return noFault
}

func (p *Provider) delayLocked(op Op) time.Duration {
	s, ok := p.latency[op]
	if !ok {
		return 0
	}
	if s.max > s.min {
		return s.min + time.Duration(p.latencyRNG.Int64N(int64(s.max-s.min)+1))
	}
	return s.min
}

// --- sandbox bookkeeping ---

// shardOf is the shard that holds (or would hold) sandbox id.
func (p *Provider) shardOf(id string) *shard {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return &p.shards[h.Sum32()%shardCount]
}

// lockAll locks every shard, in index order, and returns their unlock.
func (p *Provider) lockAll() (unlock func()) {
	for i := range p.shards {
		p.shards[i].mu.Lock()
	}
	return func() {
		for i := range p.shards {
			p.shards[i].mu.Unlock()
		}
	}
}

func expired(sb *sandbox, now time.Time) bool {
	return !sb.expiresAt.IsZero() && !now.Before(sb.expiresAt)
}

// lookupLocked returns the live sandbox id, deleting it instead if its lease
// has run out: expiry is lazy, noticed by whoever looks next. The caller
// holds sh, id's shard.
func (p *Provider) lookupLocked(sh *shard, id string) (*sandbox, bool) {
	sb, ok := sh.sandboxes[id]
	if !ok {
		return nil, false
	}
	if expired(sb, p.clock.Now()) {
		delete(sh.sandboxes, id)
		p.reaped.Add(1)
		return nil, false
	}
	return sb, true
}

// reapAllLocked deletes every expired sandbox and returns their ids,
// sorted. The caller holds every shard.
func (p *Provider) reapAllLocked() []string {
	now := p.clock.Now()
	var ids []string
	for i := range p.shards {
		for id, sb := range p.shards[i].sandboxes {
			if expired(sb, now) {
				delete(p.shards[i].sandboxes, id)
				ids = append(ids, id)
			}
		}
	}
	p.reaped.Add(int64(len(ids)))
	slices.Sort(ids)
	return ids
}

// liveCountLocked is how many sandboxes the shards hold; the caller holds
// every shard.
func (p *Provider) liveCountLocked() int {
	n := 0
	for i := range p.shards {
		n += len(p.shards[i].sandboxes)
	}
	return n
}

// issued reports whether id is one this fake handed out, so Status can
// tell a stopped sandbox from one it never had without remembering every id.
func (p *Provider) issued(id string) bool {
	rest, ok := strings.CutPrefix(id, p.prefix+"sb-")
	if !ok {
		return false
	}
	n, err := strconv.ParseInt(rest, 10, 64)
	return err == nil && n >= 1 && n <= p.nextSandbox.Load() && strconv.FormatInt(n, 10) == rest
}

// create validates spec and makes a sandbox from it, starting from the
// files of from when it is not nil (the caller then holds snapMu).
func (p *Provider) create(spec provider.Spec, from *snapshot, fromID string) (*sandbox, error) {
	workdir := spec.Workdir
	if workdir == "" {
		workdir = DefaultWorkdir
		if from != nil {
			workdir = from.spec.Workdir
		}
	}
	if !strings.HasPrefix(workdir, "/") {
		return nil, fmt.Errorf("fake: workdir %q is not absolute: %w", workdir, provider.ErrInvalidSpec)
	}
	workdir, err := resolve("/", workdir)
	if err != nil {
		return nil, fmt.Errorf("fake: workdir: %w: %w", provider.ErrInvalidSpec, err)
	}
	files := map[string]string{}
	specFiles := spec.Files
	if from != nil {
		// A fork is the snapshot's filesystem: the spec's files are ignored,
		// as provider.Snapshotter documents (a restore must not reset them
		// to what the seed wrote).
		files = maps.Clone(from.files)
		specFiles = nil
	}
	for name, data := range specFiles {
		full, err := resolve(workdir, name)
		if err != nil {
			return nil, fmt.Errorf("fake: spec file: %w: %w", provider.ErrInvalidSpec, err)
		}
		files[full] = data
	}
	now := p.clock.Now()
	sb := &sandbox{
		id:           p.prefix + "sb-" + strconv.FormatInt(p.nextSandbox.Add(1), 10),
		spec:         cloneSpec(spec),
		files:        files,
		createdAt:    now,
		fromSnapshot: fromID,
	}
	sb.spec.Workdir = workdir
	if ttl := spec.TTL(); ttl > 0 {
		sb.expiresAt = now.Add(ttl)
	}
	sh := p.shardOf(sb.id)
	sh.mu.Lock()
	sh.sandboxes[sb.id] = sb
	sh.mu.Unlock()
	return sb, nil
}

func (p *Provider) info(sb *sandbox) provider.SandboxInfo {
	return provider.SandboxInfo{
		Handle:       p.handle(sb.id),
		Status:       provider.StatusRunning,
		Metadata:     maps.Clone(sb.spec.Metadata),
		CreatedAt:    sb.createdAt,
		ExpiresAt:    sb.expiresAt,
		FromSnapshot: sb.fromSnapshot,
	}
}

func cloneSpec(s provider.Spec) provider.Spec {
	s.Env = maps.Clone(s.Env)
	s.Files = nil // the files live in the sandbox's map
	s.Metadata = maps.Clone(s.Metadata)
	s.ProviderOptions = maps.Clone(s.ProviderOptions)
	s.Entrypoint = slices.Clone(s.Entrypoint)
	s.Ports = slices.Clone(s.Ports)
	if s.Resources != nil {
		r := *s.Resources
		s.Resources = &r
	}
	return s
}

// --- inspection, for tests; these are not provider calls and are neither
// counted, hooked nor faulted ---

// Stats returns a copy of the counters. Expired sandboxes are reaped first so
// that LiveSandboxes and Reaped agree with what a lister would see.
func (p *Provider) Stats() Stats {
	p.snapMu.RLock()
	defer p.snapMu.RUnlock()
	unlock := p.lockAll()
	defer unlock()
	p.reapAllLocked()
	st := Stats{
		Calls:         map[Op]int{},
		Failures:      map[Op]int{},
		Injected:      map[Op]int{},
		Peak:          map[Op]int{},
		InFlight:      map[Op]int{},
		LiveSandboxes: p.liveCountLocked(),
		LiveSnapshots: len(p.snapshots),
		Started:       int(p.started.Load()),
		Forked:        int(p.forked.Load()),
		Stopped:       int(p.stopped.Load()),
		Reaped:        int(p.reaped.Load()),
	}
	// A map holds the ops it counted, as it would had each count been a
	// map entry made on first use.
	put := func(m map[Op]int, op Op, v *atomic.Int64) {
		if n := v.Load(); n != 0 {
			m[op] = int(n)
		}
	}
	for i, op := range allOps {
		n := &p.counts[i]
		put(st.Calls, op, &n.calls)
		put(st.Failures, op, &n.failures)
		put(st.Injected, op, &n.injected)
		put(st.Peak, op, &n.peak)
		put(st.InFlight, op, &n.inFlight)
	}
	return st
}

// PeakTotal is the most calls of any op that were ever in flight at once.
func (p *Provider) PeakTotal() int { return int(p.peakTotal.Load()) }

// Files returns a copy of a live sandbox's files, keyed by absolute path.
func (p *Provider) Files(sandboxID string) (map[string]string, bool) {
	sh := p.shardOf(sandboxID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sb, ok := p.lookupLocked(sh, sandboxID)
	if !ok {
		return nil, false
	}
	return maps.Clone(sb.files), true
}

// SnapshotFiles returns a copy of a snapshot's files, keyed by absolute path.
func (p *Provider) SnapshotFiles(snapshotID string) (map[string]string, bool) {
	p.snapMu.RLock()
	defer p.snapMu.RUnlock()
	s, ok := p.snapshots[snapshotID]
	if !ok {
		return nil, false
	}
	return maps.Clone(s.files), true
}

// Sandbox describes a live sandbox as ListSandboxes would.
func (p *Provider) Sandbox(sandboxID string) (provider.SandboxInfo, bool) {
	sh := p.shardOf(sandboxID)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sb, ok := p.lookupLocked(sh, sandboxID)
	if !ok {
		return provider.SandboxInfo{}, false
	}
	return p.info(sb), true
}

// SnapshotInfo describes a snapshot as ListSnapshots would (Snapshot is
// taken by the provider call).
func (p *Provider) SnapshotInfo(snapshotID string) (provider.SnapshotInfo, bool) {
	p.snapMu.RLock()
	defer p.snapMu.RUnlock()
	s, ok := p.snapshots[snapshotID]
	if !ok {
		return provider.SnapshotInfo{}, false
	}
	return cloneSnapshotInfo(s.info), true
}

func cloneSnapshotInfo(info provider.SnapshotInfo) provider.SnapshotInfo {
	info.Metadata = maps.Clone(info.Metadata)
	return info
}

// LiveSandboxIDs returns the ids of the live sandboxes, sorted.
func (p *Provider) LiveSandboxIDs() []string {
	unlock := p.lockAll()
	defer unlock()
	p.reapAllLocked()
	var ids []string
	for i := range p.shards {
		ids = slices.AppendSeq(ids, maps.Keys(p.shards[i].sandboxes))
	}
	slices.Sort(ids)
	return ids
}

// SnapshotIDs returns the ids of the existing snapshots, sorted.
func (p *Provider) SnapshotIDs() []string {
	p.snapMu.RLock()
	defer p.snapMu.RUnlock()
	return slices.Sorted(maps.Keys(p.snapshots))
}

// Reap deletes every sandbox whose lease has run out and returns their ids,
// sorted: what a backend's reaper would do at this instant.
func (p *Provider) Reap() []string {
	unlock := p.lockAll()
	defer unlock()
	return p.reapAllLocked()
}
