package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/snapshotindex"
)

// Checkpoint operations measured.
const (
	OpCommit  = "commit"
	OpRestore = "restore"
	OpRelease = "release"
)

// CheckpointRow is one cell of the commit, restore or release matrix: the
// median wall time of the owner's operation against the ideal schedule,
// ⌈Calls/Parallelism⌉·Latency plus the operation's one index transaction
// measured alone, in the same run, on an index of the same size.
type CheckpointRow struct {
	Op          string
	Sessions    int // N: live sessions (commit), records restored, sessions per checkpoint (release)
	Checkpoints int // K: checkpoints released (release only; 1 otherwise)
	Calls       int // provider calls with latency: N, or K·N snapshot deletes
	Latency     time.Duration
	Parallelism int
	Reps        int
	Measured    time.Duration // median over Reps
	Best        time.Duration // fastest of Reps (how far the machine's noise reaches)
	Worst       time.Duration // slowest of Reps
	Index       time.Duration // median of the index transaction alone
	Peak        int           // most concurrent provider calls of the op the fake saw
	// Wait is what one fake call of Latency really waits on this machine
	// (a Go timer overshoots by up to a millisecond); see Floor.
	Wait time.Duration
	// Load is the 1-minute load average when the cell finished.
	Load string
	// Err is why the cell could not be measured ("" when it was).
	Err string
	// Reruns: the cell was measured again because its first measure was
	// flagged (these are the second's figures).
	Reruns int
}

// Floor is the ideal schedule with the waits this machine's timers really
// give: Waves·Wait plus the index transaction. No program sleeping on Go
// timers does better, so Measured/Floor is the owner's own share.
func (r CheckpointRow) Floor() time.Duration {
	return time.Duration(r.Waves())*r.Wait + r.Index
}

// FloorRatio is Measured/Floor.
func (r CheckpointRow) FloorRatio() float64 {
	if r.Floor() <= 0 {
		return 0
	}
	return float64(r.Measured) / float64(r.Floor())
}

// Waves is ⌈Calls/Parallelism⌉.
func (r CheckpointRow) Waves() int { return (r.Calls + r.Parallelism - 1) / r.Parallelism }

// Ideal is the schedule a perfect coordinator keeps: Waves·Latency plus the
// index transaction.
func (r CheckpointRow) Ideal() time.Duration {
	return time.Duration(r.Waves())*r.Latency + r.Index
}

// Ratio is Measured/Ideal.
func (r CheckpointRow) Ratio() float64 {
	if r.Ideal() <= 0 {
		return 0
	}
	return float64(r.Measured) / float64(r.Ideal())
}

// OverheadMicros is what the owner spends beyond the ideal schedule per
// provider call, in µs. At zero latency this is the coordinator's cost per
// session.
func (r CheckpointRow) OverheadMicros() float64 {
	if r.Calls == 0 {
		return 0
	}
	return float64(r.Measured-r.Ideal()) / float64(r.Calls) / 1e3
}

// ownerEnv is an owner on the fake provider with checkpointing on.
type ownerEnv struct {
	fk  *fake.Provider
	o   *owner.Owner
	dir string
	par int
}

func newOwnerEnv(ctx context.Context, root string, parallelism int) (*ownerEnv, error) {
	dir, err := os.MkdirTemp(root, "owner-")
	if err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	e := &ownerEnv{fk: fake.New(fake.Options{Seed: 1}), dir: dir, par: parallelism}
	if err := e.open(ctx); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return e, nil
}

// open starts a fresh owner on the env's state dir and fake, as a restarted
// process would.
func (e *ownerEnv) open(ctx context.Context) error {
	o, err := owner.New(ctx, owner.Config{
		Name:     "bench",
		Provider: e.fk,
		Checkpoint: owner.CheckpointConfig{
			Enabled: true, StateDir: e.dir, Parallelism: e.par, RoundTimeout: 30 * time.Minute,
		},
	})
	if err != nil {
		return fmt.Errorf("start owner: %w", err)
	}
	e.o = o
	return nil
}

func (e *ownerEnv) close() error {
	if e.o == nil {
		return nil
	}
	err := e.o.Close()
	e.o = nil
	if err != nil {
		return fmt.Errorf("close owner: %w", err)
	}
	return nil
}

func (e *ownerEnv) remove() {
	_ = e.close()
	_ = os.RemoveAll(e.dir)
}

// notesSetup is the notes server's setup: a token written into the sandbox
// and returned as session data.
func notesSetup(token string) sandbox.SetupFunc {
	return func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) (json.RawMessage, error) {
		if err := p.WriteFile(ctx, sb.Handle, ".seed_token", []byte(token)); err != nil {
			return nil, fmt.Errorf("write seed token: %w", err)
		}
		return json.RawMessage(fmt.Sprintf(`{"seed_token":%q}`, token)), nil
	}
}

// SeedSessions starts n notes sessions named prefix-000000… on o, a few at
// a time.
func SeedSessions(ctx context.Context, o *owner.Owner, prefix string, n int) error {
	return parallel(n, 8, func(i int) error {
		sid := fmt.Sprintf("%s-%06d", prefix, i)
		_, err := o.StartSessionSandbox(ctx, sid, provider.Spec{Image: "notes", Workdir: fake.DefaultWorkdir}, notesSetup("tok-"+sid), "")
		if err != nil {
			return fmt.Errorf("seed %s: %w", sid, err)
		}
		return nil
	})
}

// parallel runs fn(0..n-1) on workers goroutines and returns the first
// error.
func parallel(n, workers int, fn func(i int) error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  int
	)
	take := func() (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		if first != nil || next >= n {
			return 0, false
		}
		next++
		return next - 1, true
	}
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i, ok := take()
				if !ok {
					return
				}
				if err := fn(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// timed runs fn after a GC, so that one cell's garbage is not collected in
// the next cell's measurement.
func timed(fn func() error) (time.Duration, error) {
	runtime.GC()
	t0 := time.Now()
	err := fn()
	return time.Since(t0), err
}

// sideIndex is the index measured alone: it receives copies of the owner's
// records, so its transactions are the same size as the owner's, on an
// index holding as many checkpoints as the owner's.
type sideIndex struct {
	x   *snapshotindex.Index
	dir string
}

func openSide(root string) (*sideIndex, error) {
	dir, err := os.MkdirTemp(root, "index-")
	if err != nil {
		return nil, fmt.Errorf("side index dir: %w", err)
	}
	x, err := snapshotindex.Open(dir, snapshotindex.Options{})
	if err != nil {
		return nil, fmt.Errorf("open side index: %w", err)
	}
	return &sideIndex{x: x, dir: dir}, nil
}

func (s *sideIndex) close() {
	_ = s.x.Close()
	_ = os.RemoveAll(s.dir)
}

// commit records ck's records under id (timed).
func (s *sideIndex) commit(id string, ck snapshotindex.Checkpoint) (time.Duration, error) {
	d, err := timed(func() error {
		_, err := s.x.Commit(snapshotindex.CheckpointMeta{ID: id, CommittedAt: ck.Meta.CommittedAt}, ck.Records)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("side index commit: %w", err)
	}
	return d, nil
}

// load reads a checkpoint back, as a restore does (timed).
func (s *sideIndex) load(id string, want int) (time.Duration, error) {
	var n int
	d, err := timed(func() error {
		ck, err := s.x.Checkpoint(id)
		n = len(ck.Records)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("side index load: %w", err)
	}
	if n != want {
		return 0, fmt.Errorf("side index load: %d records, want %d", n, want)
	}
	return d, nil
}

// cell measures one cell of the matrix: op's latency set on fk, repetitions
// of rep (it returns the owner's time and the index transaction's alone)
// until the cell has taken the plan's budget, at least one and at most
// maxReps. It adds the row to the report, failed if a repetition failed,
// and reports whether it was measured.
func (h *harness) cell(fk *fake.Provider, op fake.Op, base CheckpointRow, rep func(r int) (owner, index time.Duration, err error)) bool {
	if h.opts.breakCell != nil {
		if err := h.opts.breakCell(base); err != nil {
			h.add(failedRow(base, err))
			return false
		}
	}
	fk.SetLatency(op, base.Latency)
	defer fk.SetLatency(op, 0)
	next := 0 // rep numbers go on across a rerun: a commit's id names its rep
	measure := func() (CheckpointRow, error) {
		row := base
		var measured, index []time.Duration
		start := time.Now()
		for r := 0; r < h.plan.maxReps && (r == 0 || time.Since(start) < h.plan.budget); r++ {
			m, i, err := rep(next)
			next++
			if err != nil {
				return row, fmt.Errorf("rep %d: %w", r+1, err)
			}
			measured, index = append(measured, m), append(index, i)
		}
		row.Reps, row.Measured, row.Best, row.Worst, row.Index = len(measured), median(measured), slices.Min(measured), slices.Max(measured), median(index)
		row.Load = LoadAverage()
		row.Peak = fk.Stats().Peak[op]
		row.Wait = h.waits[row.Latency]
		return row, nil
	}
	row, err := measure()
	if err == nil && row.Flag() != "" {
		// A noisy cell gets a second chance; flagged again, it stays so.
		row, err = measure()
		row.Reruns = 1
	}
	if err != nil {
		h.add(failedRow(base, err))
		return false
	}
	h.add(row)
	return true
}

// timerWait measures what a wait of d takes here, the way the fake waits
// (a fresh time.Timer per call), with 64 waiters at once as in a checkpoint
// wave: the mean of 8 sequential waits each, median over the waiters.
func timerWait(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	const waiters, seq = 64, 8
	per := make([]time.Duration, waiters)
	var wg sync.WaitGroup
	for i := range per {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			for range seq {
				t := time.NewTimer(d)
				<-t.C
			}
			per[i] = time.Since(t0) / seq
		}()
	}
	wg.Wait()
	return median(per)
}

// fakeCost is what the fake provider itself spends per call of each
// checkpoint op at zero latency (n calls in a row on one goroutine): part
// of every L=0 overhead figure, although no real provider would spend it in
// the owner's process.
func fakeCost(ctx context.Context, n int) (map[fake.Op]time.Duration, error) {
	fk := fake.New(fake.Options{Seed: 1})
	hs := make([]provider.Handle, n)
	for i := range hs {
		h, err := fk.Start(ctx, provider.Spec{Image: "notes", Workdir: fake.DefaultWorkdir, Metadata: map[string]string{owner.LabelSession: fmt.Sprint(i)}})
		if err != nil {
			return nil, fmt.Errorf("fake start: %w", err)
		}
		if err := fk.WriteFile(ctx, h, ".seed_token", []byte("tok")); err != nil {
			return nil, fmt.Errorf("fake write: %w", err)
		}
		hs[i] = h
	}
	snaps := make([]string, n)
	forks := make([]provider.Handle, n)
	cost := map[fake.Op]time.Duration{}
	for _, op := range []fake.Op{fake.OpSnapshot, fake.OpFork, fake.OpDeleteSnapshot} {
		if op == fake.OpDeleteSnapshot {
			// A snapshot a live fork stands on is not deleted: the forks
			// go first, untimed.
			for _, f := range forks {
				if err := fk.Stop(ctx, f); err != nil {
					return nil, fmt.Errorf("fake stop: %w", err)
				}
			}
		}
		d, err := timed(func() error {
			for i := range n {
				var err error
				switch op {
				case fake.OpSnapshot:
					snaps[i], err = fk.Snapshot(ctx, hs[i], "bench")
				case fake.OpFork:
					forks[i], err = fk.Fork(ctx, provider.Spec{Image: "notes"}, snaps[i])
				case fake.OpDeleteSnapshot:
					err = fk.DeleteSnapshot(ctx, snaps[i])
				}
				if err != nil {
					return fmt.Errorf("fake %s: %w", op, err)
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		cost[op] = d / time.Duration(n)
	}
	return cost, nil
}

// seeded opens an owner and a side index under the harness's directory and
// seeds n sessions on the owner; on an error nothing is left open.
func (h *harness) seeded(ctx context.Context, n, par int) (*ownerEnv, *sideIndex, error) {
	env, err := newOwnerEnv(ctx, h.tmp, par)
	if err != nil {
		return nil, nil, err
	}
	side, err := openSide(h.tmp)
	if err != nil {
		env.remove()
		return nil, nil, err
	}
	if err := SeedSessions(ctx, env.o, "s", n); err != nil {
		side.close()
		env.remove()
		return nil, nil, err
	}
	return env, side, nil
}

// commitAndRestore measures commit and then restore of n sessions at
// parallelism par for every latency of the plan. Commit runs on one owner;
// every restore runs on a fresh owner on the same state dir and fake, as
// after a restart.
func (h *harness) commitAndRestore(ctx context.Context, n, par int) {
	failAll := func(err error) {
		for _, op := range []string{OpCommit, OpRestore} {
			for _, lat := range h.plan.latencies {
				h.add(failedRow(CheckpointRow{Op: op, Sessions: n, Checkpoints: 1, Calls: n, Latency: lat, Parallelism: par}, err))
			}
		}
	}
	env, side, err := h.seeded(ctx, n, par)
	if err != nil {
		failAll(err)
		return
	}
	defer env.remove()
	defer side.close()

	var lastID string
	for li, lat := range h.plan.latencies {
		base := CheckpointRow{Op: OpCommit, Sessions: n, Checkpoints: 1, Calls: n, Latency: lat, Parallelism: par}
		h.cell(env.fk, fake.OpSnapshot, base, func(r int) (time.Duration, time.Duration, error) {
			id := fmt.Sprintf("c-%d-%d", li, r)
			var res owner.CommitResult
			d, err := timed(func() error {
				var err error
				res, err = env.o.Commit(ctx, owner.CommitRequest{CheckpointID: id})
				return err
			})
			if err != nil {
				return 0, 0, fmt.Errorf("commit %s of %d sessions: %w", id, n, err)
			}
			if len(res.Sessions) != n {
				return 0, 0, fmt.Errorf("commit %s exported %d sessions, want %d", id, len(res.Sessions), n)
			}
			ck, err := env.o.Index().Checkpoint(id)
			if err != nil {
				return 0, 0, fmt.Errorf("read back %s: %w", id, err)
			}
			// Checkpoints pile up in both indexes alike: a release between
			// repetitions would cost more than the commits (its index
			// transaction grows with the square of the records dropped) and
			// leave value-log GC running into the next measurement.
			di, err := side.commit(id, ck)
			if err == nil {
				lastID = id
			}
			return d, di, err
		})
	}
	err = env.close()
	for _, lat := range h.plan.latencies {
		base := CheckpointRow{Op: OpRestore, Sessions: n, Checkpoints: 1, Calls: n, Latency: lat, Parallelism: par}
		switch {
		case err != nil:
			h.add(failedRow(base, err))
			continue
		case lastID == "":
			h.add(failedRow(base, errors.New("no commit of this cell succeeded: nothing to restore")))
			continue
		}
		h.cell(env.fk, fake.OpFork, base, func(int) (time.Duration, time.Duration, error) {
			if err := env.open(ctx); err != nil {
				return 0, 0, err
			}
			var res owner.RestoreResult
			d, err := timed(func() error {
				var err error
				res, err = env.o.Restore(ctx, owner.RestoreRequest{CheckpointID: lastID})
				return err
			})
			if err != nil {
				return 0, 0, fmt.Errorf("restore %s of %d sessions: %w", lastID, n, err)
			}
			if len(res.Sessions) != n {
				return 0, 0, fmt.Errorf("restore %s installed %d sessions, want %d", lastID, len(res.Sessions), n)
			}
			if err := env.close(); err != nil {
				return 0, 0, err
			}
			di, err := side.load(lastID, n)
			return d, di, err
		})
		// A failed restore may leave the owner open.
		_ = env.close()
	}
}

// release measures releasing k checkpoints of n sessions each (k·n snapshot
// deletes) at parallelism par, for every latency of the plan.
func (h *harness) release(ctx context.Context, k, n, par int) {
	failAll := func(err error) {
		for _, lat := range h.plan.latencies {
			h.add(failedRow(CheckpointRow{Op: OpRelease, Sessions: n, Checkpoints: k, Calls: k * n, Latency: lat, Parallelism: par}, err))
		}
	}
	env, side, err := h.seeded(ctx, n, par)
	if err != nil {
		failAll(err)
		return
	}
	defer env.remove()
	defer side.close()
	seq := 0
	for _, lat := range h.plan.latencies {
		base := CheckpointRow{Op: OpRelease, Sessions: n, Checkpoints: k, Calls: k * n, Latency: lat, Parallelism: par}
		h.cell(env.fk, fake.OpDeleteSnapshot, base, func(int) (time.Duration, time.Duration, error) {
			// K checkpoints of every session, in the owner's index and
			// the side index alike (untimed; snapshots at zero latency).
			var ids []string
			var tombs []snapshotindex.Tombstone
			for j := 0; j < k; j++ {
				seq++
				id := fmt.Sprintf("c-%d", seq)
				if _, err := env.o.Commit(ctx, owner.CommitRequest{CheckpointID: id}); err != nil {
					return 0, 0, fmt.Errorf("commit %s to release: %w", id, err)
				}
				ck, err := env.o.Index().Checkpoint(id)
				if err != nil {
					return 0, 0, fmt.Errorf("read back %s: %w", id, err)
				}
				if _, err := side.commit(id, ck); err != nil {
					return 0, 0, err
				}
				ids = append(ids, id)
				for _, rec := range ck.Records {
					tombs = append(tombs, snapshotindex.Tombstone{SnapshotID: rec.SnapshotID, Provider: rec.Provider, Reason: "released", At: time.Now()})
				}
			}
			var res owner.ReleaseResult
			d, err := timed(func() error {
				var err error
				res, err = env.o.Release(ctx, nil)
				return err
			})
			if err != nil {
				return 0, 0, fmt.Errorf("release %d checkpoints: %w", k, err)
			}
			if len(res.Dropped) != k || len(res.Deleted) != k*n {
				return 0, 0, fmt.Errorf("release dropped %d checkpoints and deleted %d snapshots, want %d and %d", len(res.Dropped), len(res.Deleted), k, k*n)
			}
			di, err := timed(func() error { return side.x.Drop(ids, tombs) })
			if err != nil {
				return 0, 0, fmt.Errorf("side index drop: %w", err)
			}
			snaps := make([]string, len(tombs))
			for i, t := range tombs {
				snaps[i] = t.SnapshotID
			}
			if err := side.x.ClearTombstones(snaps); err != nil {
				return 0, 0, fmt.Errorf("side index clear: %w", err)
			}
			return d, di, nil
		})
	}
}
