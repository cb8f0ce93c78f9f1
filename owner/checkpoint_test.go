package owner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/snapshotindex"
)

func TestCommitSnapshotsLiveSessionsAndLeavesThemRunning(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	spec := provider.Spec{Image: "notes", Env: map[string]string{"A": "1"}, Ports: []int{8080}, TTLSeconds: 600,
		Files: map[string]string{"notes.txt": ""}}
	if _, err := o.StartSessionSandbox(context.Background(), "session-with-a-long-id", spec, notesSetup("tok"), ""); err != nil {
		t.Fatal(err)
	}
	appendNote(t, o, "session-with-a-long-id", "one")
	res := commit(t, o, "c1")
	if diff := cmp.Diff([]string{"session-with-a-long-id"}, res.Sessions); diff != "" {
		t.Fatalf("exported (-want +got):\n%s", diff)
	}
	appendNote(t, o, "session-with-a-long-id", "two") // drift after the checkpoint

	ck := loadCheckpoint(t, e, o, "c1")
	r := ck.Records[0]
	if r.Provider != "fake" || r.Workdir != fake.DefaultWorkdir || string(r.Data) != `{"seed_token":"tok"}` {
		t.Fatalf("record: %+v", r)
	}
	if diff := cmp.Diff(spec.Ports, r.Spec.Ports); diff != "" {
		t.Fatalf("spec ports (-want +got):\n%s", diff)
	}
	if r.Spec.Image != "notes" || r.Spec.Env["A"] != "1" || r.Spec.TTLSeconds != 600 || len(r.Spec.Files) != 0 {
		t.Fatalf("spec did not round-trip with its files emptied: %+v", r.Spec)
	}
	info, ok := e.fk.SnapshotInfo(r.SnapshotID)
	if !ok || !strings.HasPrefix(info.Name, "ng-session-with-a-l-") {
		t.Fatalf("snapshot name %q does not start with ng-<session[:16]>-", info.Name)
	}
	files, _ := e.fk.SnapshotFiles(r.SnapshotID)
	if got := files[fake.DefaultWorkdir+"/notes.txt"]; got != "one\n" {
		t.Fatalf("snapshot holds %q, want the notes at export", got)
	}
	if diff := cmp.Diff([]string{"one", "two"}, notes(t, o, "session-with-a-long-id")); diff != "" {
		t.Fatalf("the sandbox did not keep running (-want +got):\n%s", diff)
	}
	// A retried commit of the same id does not snapshot again.
	before := e.fk.Stats().Calls[fake.OpSnapshot]
	again := commit(t, o, "c1")
	if !again.Existing || e.fk.Stats().Calls[fake.OpSnapshot] != before {
		t.Fatalf("re-commit snapshotted again: %+v", again)
	}
}

// loadCheckpoint reads a checkpoint through the owner's open index.
func loadCheckpoint(t *testing.T, e *env, o *owner.Owner, id string) snapshotindex.Checkpoint {
	t.Helper()
	ck, err := o.Index().Checkpoint(id)
	if err != nil {
		t.Fatalf("checkpoint %s: %v", id, err)
	}
	return ck
}

func TestCommitSkipsSessionsInSetup(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	seed(t, o, "ready")
	entered, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := o.StartSessionSandbox(context.Background(), "in-setup", provider.Spec{}, func(context.Context, provider.Provider, sandbox.Sandbox) (json.RawMessage, error) {
			close(entered)
			<-release
			return nil, nil
		}, "")
		done <- err
	}()
	<-entered
	res := commit(t, o, "c1")
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"ready"}, res.Sessions); diff != "" {
		t.Fatalf("exported (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"in-setup"}, res.Skipped); diff != "" {
		t.Fatalf("skipped (-want +got):\n%s", diff)
	}
}

// TestCheckpointCallsAreBounded: with checkpoint.parallelism 2, the
// snapshots of a commit and the forks of a restore run two at a time. Every
// call is held at the provider until each one is accounted for (held at the
// provider, or waiting for a slot): then exactly two are at the provider.
func TestCheckpointCallsAreBounded(t *testing.T) {
	const n, par = 6, 2
	e := newEnv(t)
	o1 := e.open(parallelism(par))
	commitHeld(t, e, o1, n, par)
	o1.Abandon()
	o2 := e.open(parallelism(par))
	res := holdAndCount(t, e.fk, fake.OpFork, o2, n, par, func() (int, error) {
		r, err := o2.Restore(context.Background(), owner.RestoreRequest{CheckpointID: "c1"})
		return len(r.Sessions), err
	})
	if res != n {
		t.Fatalf("restored %d sessions, want %d", res, n)
	}
}

// Without checkpoint.parallelism a commit snapshots 16 sessions at once.
func TestCheckpointParallelismDefaultsTo16(t *testing.T) {
	e := newEnv(t)
	commitHeld(t, e, e.open(), 17, 16)
}

// commitHeld seeds n sessions in o and commits them as c1 with every
// snapshot held at the provider until all n are held or wait for a slot;
// it checks that par are held and that all n are exported.
func commitHeld(t *testing.T, e *env, o *owner.Owner, n, par int) {
	t.Helper()
	for i := 0; i < n; i++ {
		seed(t, o, fmt.Sprintf("s%d", i))
	}
	res := holdAndCount(t, e.fk, fake.OpSnapshot, o, n, par, func() (int, error) {
		r, err := o.Commit(context.Background(), owner.CommitRequest{CheckpointID: "c1"})
		return len(r.Sessions), err
	})
	if res != n {
		t.Fatalf("exported %d sessions, want %d", res, n)
	}
}

// holdAndCount runs call with every provider call of op held at its start,
// waits until all n calls are held or queued for a slot, checks that par
// are held, then lets them go and returns call's result.
func holdAndCount(t *testing.T, fk *fake.Provider, op fake.Op, o *owner.Owner, n, par int, call func() (int, error)) int {
	t.Helper()
	var mu sync.Mutex
	held := 0
	entered := make(chan struct{}, n*2)
	release := make(chan struct{})
	fk.SetHook(func(c fake.Call) {
		if c.Op != op || c.Phase != fake.PhaseBegin {
			return
		}
		mu.Lock()
		held++
		mu.Unlock()
		entered <- struct{}{}
		<-release
	})
	defer fk.SetHook(nil)
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, err := call()
		done <- result{got, err}
	}()
	for {
		waiting, changed := o.CheckpointQueue()
		mu.Lock()
		h := held
		mu.Unlock()
		if h+waiting >= n {
			if h != par {
				close(release)
				<-done
				t.Fatalf("%s: %d calls at the provider at once (%d queued), want %d", op, h, waiting, par)
			}
			break
		}
		select {
		case <-changed:
		case <-entered:
		}
	}
	close(release)
	r := <-done
	if r.err != nil {
		t.Fatalf("%s: %v", op, r.err)
	}
	return r.n
}

func TestFailedCommitRecordsNothingAndLeavesNoSnapshot(t *testing.T) {
	cases := map[string]func(e *env, o *owner.Owner, sandboxID string) error{
		"fails before the effect": func(e *env, o *owner.Owner, id string) error {
			e.fk.FailNextFor(fake.OpSnapshot, id, 1)
			_, err := o.Commit(context.Background(), owner.CommitRequest{CheckpointID: "c1"})
			return err
		},
		"fails after the effect": func(e *env, o *owner.Owner, id string) error {
			e.fk.FailAfterEffect(fake.OpSnapshot, 1)
			_, err := o.Commit(context.Background(), owner.CommitRequest{CheckpointID: "c1"})
			return err
		},
		// The deadline is the request's (the controller's deadline_ts),
		// on the owner's clock: the round fails when the test moves the
		// clock past it while a snapshot hangs.
		"hangs past the request's deadline": func(e *env, o *owner.Owner, id string) error {
			return commitPastDeadline(e, o, e.clk.Now().Add(time.Second), time.Second)
		},
		// No deadline in the request: checkpoint.round_timeout bounds it.
		"hangs past the round timeout": func(e *env, o *owner.Owner, id string) error {
			return commitPastDeadline(e, o, time.Time{}, time.Minute)
		},
	}
	for name, run := range cases {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			o := e.open(parallelism(1), roundTimeout(time.Minute))
			seed(t, o, "s1")
			s2 := seed(t, o, "s2")
			seed(t, o, "s3")
			err := run(e, o, s2.Handle.SandboxID)
			if !errors.Is(err, owner.ErrCommitFailed) {
				t.Fatalf("commit: got %v, want ErrCommitFailed", err)
			}
			var ce *owner.CommitError
			if !errors.As(err, &ce) || len(ce.Failed) == 0 {
				t.Fatalf("commit error names no session: %v", err)
			}
			if name == "fails before the effect" && !strings.Contains(err.Error(), `session "s2" could not be snapshotted`) {
				t.Fatalf("error does not name s2: %v", err)
			}
			if strings.HasPrefix(name, "hangs") {
				// Every session was failed at the deadline: the hung one,
				// and those still waiting for the limiter's one slot (or,
				// if one got it first, nothing is taken past it).
				for sid, why := range ce.Failed {
					if !strings.Contains(why, "deadline") {
						t.Fatalf("session %s failed for %q, not the deadline", sid, why)
					}
				}
			}
			if _, err := o.Index().Checkpoint("c1"); !errors.Is(err, snapshotindex.ErrNotFound) {
				t.Fatalf("a failed commit was recorded: %v", err)
			}
			// Checked as soon as Commit returns: a failed commit returns
			// only once the snapshots of its round are deleted.
			st := e.fk.Stats()
			if st.LiveSnapshots != 0 {
				t.Fatalf("%d snapshots left behind: %v", st.LiveSnapshots, e.fk.SnapshotIDs())
			}
			if st.LiveSandboxes != 3 {
				t.Fatalf("live sandboxes = %d, want all 3 still running", st.LiveSandboxes)
			}
			ts, _ := o.Index().Tombstones()
			if len(ts) != 0 {
				t.Fatalf("tombstones left: %v", ts)
			}
			// The episodes continue, and the next commit succeeds.
			appendNote(t, o, "s2", "after")
			if res := commit(t, o, "c2"); len(res.Sessions) != 3 {
				t.Fatalf("next commit exported %v", res.Sessions)
			}
		})
	}
}

// commitPastDeadline commits with the next snapshot hanging, and moves the
// owner's clock by step once that snapshot has begun (the round's deadline
// is armed before any session is asked). It returns the commit's error.
func commitPastDeadline(e *env, o *owner.Owner, deadline time.Time, step time.Duration) error {
	began := make(chan struct{}, 1)
	e.fk.SetHook(func(c fake.Call) {
		if c.Op == fake.OpSnapshot && c.Phase == fake.PhaseBegin {
			select {
			case began <- struct{}{}:
			default:
			}
		}
	})
	defer e.fk.SetHook(nil)
	e.fk.HangNext(fake.OpSnapshot, 1)
	done := make(chan error, 1)
	go func() {
		_, err := o.Commit(context.Background(), owner.CommitRequest{CheckpointID: "c1", Deadline: deadline})
		done <- err
	}()
	<-began
	e.clk.Advance(step)
	return <-done
}

func TestProviderWithoutSnapshotsCannotBeExported(t *testing.T) {
	e := newEnv(t)
	ns := fake.NewWithoutSnapshots(fake.Options{})
	o, err := owner.New(context.Background(), e.config(func(c *owner.Config) { c.Provider = ns }))
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if _, err := o.Restore(context.Background(), owner.RestoreRequest{CheckpointID: "c1"}); !errors.Is(err, owner.ErrRestoreFailed) {
		t.Fatalf("restore on restart_only: %v", err)
	}
}

// crashAndRestore commits on one owner, drifts, drops it without shutdown,
// and restores on a fresh owner over the same state dir and fake.
func TestCrashThenFreshOwnerRestores(t *testing.T) {
	e := newEnv(t)
	o1 := e.open()
	sb1 := seed(t, o1, "s1")
	seed(t, o1, "s2")
	appendNote(t, o1, "s1", "one")
	appendNote(t, o1, "s2", "uno")
	commit(t, o1, "c1")
	appendNote(t, o1, "s1", "drift")
	o1.Abandon()

	o2 := e.open()
	// The crashed owner's sandboxes serve nobody: the fresh one stopped them.
	if got := e.fk.Stats().LiveSandboxes; got != 0 {
		t.Fatalf("%d sandboxes of the crashed owner still run", got)
	}
	res, err := o2.Restore(context.Background(), owner.RestoreRequest{CheckpointID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Sessions) != 2 {
		t.Fatalf("restored %d sessions", len(res.Sessions))
	}
	if diff := cmp.Diff([]string{"one"}, notes(t, o2, "s1")); diff != "" {
		t.Fatalf("restored notes (-want +got):\n%s", diff)
	}
	if got := string(o2.SessionData(context.Background(), "s1")); got != `{"seed_token":"tok-s1"}` {
		t.Fatalf("restored data %s", got)
	}
	if _, _, fate := o2.SandboxFate(sb1.Handle.SandboxID); fate != sandbox.FateSuperseded {
		t.Fatalf("fate of the superseded sandbox = %s", fate)
	}
	// A replacement attempt re-seeding the session gets the fork; its setup
	// does not run again.
	ran := false
	sb, err := o2.StartSessionSandbox(context.Background(), "s1", provider.Spec{}, func(context.Context, provider.Provider, sandbox.Sandbox) (json.RawMessage, error) {
		ran = true
		return nil, nil
	}, "")
	if err != nil || ran || !sb.Restored || sb.Handle.SandboxID != res.Sessions[0].Sandbox.Handle.SandboxID {
		t.Fatalf("re-seed: sb=%+v err=%v setup ran=%v", sb, err, ran)
	}
	appendNote(t, o2, "s1", "two")
	if diff := cmp.Diff([]string{"one", "two"}, notes(t, o2, "s1")); diff != "" {
		t.Fatalf("notes after continuing (-want +got):\n%s", diff)
	}
	// Restoring over live sessions is refused, and touches no provider.
	forks := e.fk.Stats().Calls[fake.OpFork]
	if _, err := o2.Restore(context.Background(), owner.RestoreRequest{CheckpointID: "c1"}); !errors.Is(err, owner.ErrInvalidRecord) {
		t.Fatalf("restore over live sessions: %v", err)
	}
	if e.fk.Stats().Calls[fake.OpFork] != forks {
		t.Fatal("a refused restore forked")
	}
}

func TestRestoreWorksWhenOldSandboxIsGoneOrCannotStop(t *testing.T) {
	e := newEnv(t)
	o1 := e.open()
	sb := seed(t, o1, "s1")
	commit(t, o1, "c1")
	o1.Abandon()
	// The old box refuses to stop: the restore still succeeds.
	e.fk.FailNextFor(fake.OpStop, sb.Handle.SandboxID, 10)
	o2 := e.open()
	res, err := o2.Restore(context.Background(), owner.RestoreRequest{CheckpointID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.SupersedeFailed) != 1 {
		t.Fatalf("supersede failures %v, want the one refusing box", res.SupersedeFailed)
	}
}

func TestRestoreValidatesEveryRecordBeforeTouchingTheProvider(t *testing.T) {
	e := newEnv(t)
	snap := makeSnapshot(t, e.fk)
	idx, err := snapshotindex.Open(e.dir, snapshotindex.Options{})
	if err != nil {
		t.Fatal(err)
	}
	good := snapshotindex.Record{SessionID: "good", Provider: "fake", SnapshotID: snap, Workdir: "/workspace"}
	foreign := snapshotindex.Record{SessionID: "foreign", Provider: "opensandbox", SnapshotID: snap}
	badData := snapshotindex.Record{SessionID: "bad-data", Provider: "fake", SnapshotID: snap, Data: json.RawMessage(`"str"`)}
	noData := snapshotindex.Record{SessionID: "no-data", Provider: "fake", SnapshotID: snap, Workdir: "/workspace"}
	for id, recs := range map[string][]snapshotindex.Record{
		"mixed-foreign": {good, foreign},
		"mixed-data":    {good, badData},
		"no-data":       {noData},
	} {
		if _, err := idx.Commit(snapshotindex.CheckpointMeta{ID: id}, recs); err != nil {
			t.Fatal(err)
		}
	}
	idx.Close()
	o := e.open()
	calls := e.fk.Stats().Calls[fake.OpFork]
	for _, id := range []string{"mixed-foreign", "mixed-data"} {
		if _, err := o.Restore(context.Background(), owner.RestoreRequest{CheckpointID: id}); !errors.Is(err, owner.ErrInvalidRecord) {
			t.Fatalf("restore %s: got %v, want ErrInvalidRecord", id, err)
		}
	}
	if got := e.fk.Stats().Calls[fake.OpFork]; got != calls {
		t.Fatalf("an invalid checkpoint forked %d times", got-calls)
	}
	if ids, _ := o.Sessions(); len(ids) != 0 {
		t.Fatalf("an invalid restore installed %v", ids)
	}
	if _, err := o.Restore(context.Background(), owner.RestoreRequest{CheckpointID: "missing"}); !errors.Is(err, owner.ErrUnknownCheckpoint) {
		t.Fatalf("unknown checkpoint: %v", err)
	}
	// A record without data restores as {}.
	if _, err := o.Restore(context.Background(), owner.RestoreRequest{CheckpointID: "no-data"}); err != nil {
		t.Fatal(err)
	}
	if got := string(o.SessionData(context.Background(), "no-data")); got != "{}" {
		t.Fatalf("data of a record without data = %s, want {}", got)
	}
}

// makeSnapshot makes a snapshot on the fake outside any owner.
func makeSnapshot(t *testing.T, fk *fake.Provider) string {
	t.Helper()
	ctx := context.Background()
	h, err := fk.Start(ctx, provider.Spec{Files: map[string]string{"notes.txt": "x\n"}})
	if err != nil {
		t.Fatal(err)
	}
	id, err := fk.Snapshot(ctx, h, "ng-manual")
	if err != nil {
		t.Fatal(err)
	}
	if err := fk.Stop(ctx, h); err != nil {
		t.Fatal(err)
	}
	return id
}

// committedAndReopened seeds s0..s3 in an owner, commits them as c1, abandons
// that owner as a crash would, and opens a fresh one on the same state with
// opts: the start of a restore.
func (e *env) committedAndReopened(opts ...cfgOpt) *owner.Owner {
	e.t.Helper()
	o1 := e.open()
	for i := 0; i < 4; i++ {
		seed(e.t, o1, fmt.Sprintf("s%d", i))
	}
	commit(e.t, o1, "c1")
	o1.Abandon()
	return e.open(opts...)
}

func TestRestoreRollsBackWhenOneForkFails(t *testing.T) {
	for name, inject := range map[string]func(*fake.Provider){
		"fork fails":          func(fk *fake.Provider) { fk.FailNext(fake.OpFork, 1) },
		"fork fails after it": func(fk *fake.Provider) { fk.FailAfterEffect(fake.OpFork, 1) },
		"snapshot is gone": func(fk *fake.Provider) {
			_ = fk.DeleteSnapshot(context.Background(), fk.SnapshotIDs()[0])
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			o2 := e.committedAndReopened(parallelism(2))
			inject(e.fk)
			_, err := o2.Restore(context.Background(), owner.RestoreRequest{CheckpointID: "c1"})
			if !errors.Is(err, owner.ErrRestoreFailed) {
				t.Fatalf("got %v, want ErrRestoreFailed", err)
			}
			if got := e.fk.Stats().LiveSandboxes; got != 0 {
				t.Fatalf("%d forks left running after a failed restore (fail-after-effect forks leak unless found)", got)
			}
			if ids, _ := o2.Sessions(); len(ids) != 0 {
				t.Fatalf("a failed restore installed %v", ids)
			}
		})
	}
}

func TestRetireKeepsSnapshotsAndRetriesFailedStops(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	s1 := seed(t, o, "s1")
	seed(t, o, "s2")
	commit(t, o, "c1")
	e.fk.FailNextFor(fake.OpStop, s1.Handle.SandboxID, 1)
	res, err := o.Retire(context.Background(), []string{"s1", "s2", "unknown"})
	if err == nil || len(res.Failed) != 1 {
		t.Fatalf("retire with a failing stop: %+v, %v", res, err)
	}
	if _, err := o.RequireSessionSandbox(context.Background(), "s1"); err != nil {
		t.Fatalf("a failed stop dropped the session: %v", err)
	}
	res, err = o.Retire(context.Background(), []string{"s1", "s2"})
	if err != nil || len(res.Stopped) != 1 {
		t.Fatalf("retry: %+v, %v", res, err)
	}
	st := e.fk.Stats()
	if st.LiveSandboxes != 0 || st.LiveSnapshots != 2 || st.Calls[fake.OpDeleteSnapshot] != 0 {
		t.Fatalf("after retire: %+v", st)
	}
}

func TestCommitWithStopParks(t *testing.T) {
	t.Run("kill", func(t *testing.T) {
		e := newEnv(t)
		o := e.open()
		seed(t, o, "s1")
		s2 := seed(t, o, "s2")
		e.fk.FailNextFor(fake.OpStop, s2.Handle.SandboxID, 1)
		res, err := o.Commit(context.Background(), owner.CommitRequest{CheckpointID: "c1", Stop: true})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"s1"}, res.Parked); diff != "" {
			t.Fatalf("parked (-want +got):\n%s", diff)
		}
		if len(res.ParkFailed) != 1 {
			t.Fatalf("park failures %v", res.ParkFailed)
		}
		if got := e.fk.LiveSandboxIDs(); len(got) != 1 || got[0] != s2.Handle.SandboxID {
			t.Fatalf("live after park: %v, want only the box that refused", got)
		}
		o.Abandon()
		o2 := e.open()
		if r, err := o2.Restore(context.Background(), owner.RestoreRequest{CheckpointID: "c1"}); err != nil || len(r.Sessions) != 2 {
			t.Fatalf("restore after park: %+v, %v", r, err)
		}
	})
	t.Run("none", func(t *testing.T) {
		e := newEnv(t)
		o := e.open(onStop(owner.OnStopNone))
		seed(t, o, "s1")
		res, err := o.Commit(context.Background(), owner.CommitRequest{CheckpointID: "c1", Stop: true})
		if err != nil || len(res.Parked) != 0 {
			t.Fatalf("%+v, %v", res, err)
		}
		if _, err := o.RequireSessionSandbox(context.Background(), "s1"); err != nil {
			t.Fatalf("on_stop none stopped the session: %v", err)
		}
	})
}

func TestReleaseDeletesOnlyWhatNoKeptCheckpointNeeds(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	seed(t, o, "s1")
	seed(t, o, "s2")
	commit(t, o, "c1")
	commit(t, o, "c2")
	if err := o.EndSessionSandbox(context.Background(), "s2"); err != nil {
		t.Fatal(err)
	}
	c2 := loadCheckpoint(t, e, o, "c2")
	res, err := o.Release(context.Background(), []string{"c2"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"c1"}, res.Dropped); diff != "" {
		t.Fatalf("dropped (-want +got):\n%s", diff)
	}
	want := []string{c2.Records[0].SnapshotID, c2.Records[1].SnapshotID}
	sort.Strings(want)
	if diff := cmp.Diff(want, e.fk.SnapshotIDs()); diff != "" {
		t.Fatalf("snapshots left (-want +got):\n%s", diff)
	}
	// Idempotent.
	again, err := o.Release(context.Background(), []string{"c2"})
	if err != nil || len(again.Dropped)+len(again.Deleted) != 0 {
		t.Fatalf("second release: %+v, %v", again, err)
	}
	checkConsistentOpen(t, e, o)
}

func TestReleaseDefersSnapshotsALiveForkStandsOn(t *testing.T) {
	e := newEnv(t)
	o1 := e.open()
	seed(t, o1, "s1")
	commit(t, o1, "c1")
	o1.Abandon()
	o2 := e.open()
	if _, err := o2.Restore(context.Background(), owner.RestoreRequest{CheckpointID: "c1"}); err != nil {
		t.Fatal(err)
	}
	res, err := o2.Release(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Deferred) != 1 || e.fk.Stats().LiveSnapshots != 1 {
		t.Fatalf("the live fork's snapshot was not deferred: %+v", res)
	}
	if err := o2.EndSessionSandbox(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := o2.Release(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if st := e.fk.Stats(); st.LiveSnapshots != 0 || st.LiveSandboxes != 0 {
		t.Fatalf("after the last release: %d snapshots, %d sandboxes", st.LiveSnapshots, st.LiveSandboxes)
	}
}

// TestFailedDeleteKeepsTombstoneForTheNextRelease: of two deletes, the one
// that fails keeps its tombstone (and only it), and the next release
// deletes it.
func TestFailedDeleteKeepsTombstoneForTheNextRelease(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	seed(t, o, "s1")
	seed(t, o, "s2")
	commit(t, o, "c1")
	ck, err := o.Index().Checkpoint("c1")
	if err != nil || len(ck.Records) != 2 {
		t.Fatalf("checkpoint c1: %v %v", ck, err)
	}
	failing := ck.Records[0].SnapshotID
	e.fk.FailNextFor(fake.OpDeleteSnapshot, failing, 1)
	if _, err := o.Release(context.Background(), nil); err == nil {
		t.Fatal("a failed delete was not reported")
	}
	ts, _ := o.Index().Tombstones()
	var left []string
	for _, x := range ts {
		left = append(left, x.SnapshotID)
	}
	if diff := cmp.Diff([]string{failing}, left); diff != "" {
		t.Fatalf("tombstones after one failed delete (-want +got):\n%s", diff)
	}
	if got := e.fk.SnapshotIDs(); !cmp.Equal([]string{failing}, got) {
		t.Fatalf("snapshots %v, want only the undeleted %s", got, failing)
	}
	if _, err := o.Release(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if got := e.fk.Stats().LiveSnapshots; got != 0 {
		t.Fatalf("%d snapshots after the retry", got)
	}
	if ts, _ := o.Index().Tombstones(); len(ts) != 0 {
		t.Fatalf("tombstones %v after every delete succeeded", ts)
	}
}

func TestCrashMidCommitLeaksNothing(t *testing.T) {
	e := newEnv(t)
	o1 := e.open(parallelism(1))
	for i := 0; i < 3; i++ {
		seed(t, o1, fmt.Sprintf("s%d", i))
	}
	// After the second snapshot, the third hangs; the owner then crashes.
	twoDone := make(chan struct{})
	var mu sync.Mutex
	ended := 0
	e.fk.SetHook(func(c fake.Call) {
		if c.Op == fake.OpSnapshot && c.Phase == fake.PhaseEnd && c.Err == nil {
			mu.Lock()
			defer mu.Unlock()
			ended++
			if ended == 2 {
				e.fk.HangNext(fake.OpSnapshot, 1)
				close(twoDone)
			}
		}
	})
	errc := make(chan error, 1)
	go func() {
		_, err := o1.Commit(context.Background(), owner.CommitRequest{CheckpointID: "c1"})
		errc <- err
	}()
	<-twoDone
	o1.Abandon()
	if err := <-errc; err == nil {
		t.Fatal("a commit interrupted by a crash succeeded")
	}
	e.fk.SetHook(nil)
	o2 := e.open()
	st := e.fk.Stats()
	if st.LiveSnapshots != 0 || st.LiveSandboxes != 0 {
		t.Fatalf("after recovery: %d snapshots %v, %d sandboxes", st.LiveSnapshots, e.fk.SnapshotIDs(), st.LiveSandboxes)
	}
	if cks, _ := o2.Checkpoints(); len(cks) != 0 {
		t.Fatalf("checkpoints after a crashed commit: %v", cks)
	}
	if in, _ := o2.Index().Intents(""); !onlyRoundsOf(in, o2) {
		t.Fatalf("intents left: %v", in)
	}
}

func checkConsistentOpen(t *testing.T, e *env, o *owner.Owner) {
	t.Helper()
	o.Abandon()
	checkConsistent(t, e.fk, e.dir)
}

// TestRestoreFindsItsCheckpointByDirAndEpisodes: a restore names its
// checkpoint by id or by the dir it was committed with (the latest), the
// dir must match when both are given, and Episodes limits it to the
// records labelled with them.
func TestRestoreFindsItsCheckpointByDirAndEpisodes(t *testing.T) {
	e := newEnv(t)
	o1 := e.open()
	seed(t, o1, "s1")
	seed(t, o1, "s2")
	req := owner.CommitRequest{CheckpointID: "c1", CheckpointDir: "/d", Episodes: map[string]string{"s1": "r1", "s2": "r2"}}
	if _, err := o1.Commit(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	o1.Abandon()
	o2 := e.open()
	ctx := context.Background()
	for name, bad := range map[string]owner.RestoreRequest{
		"an unknown dir":        {CheckpointDir: "/nope"},
		"neither id nor dir":    {},
		"an unknown id":         {CheckpointID: "c9"},
		"the id with other dir": {CheckpointID: "c1", CheckpointDir: "/other"},
	} {
		if _, err := o2.Restore(ctx, bad); !errors.Is(err, owner.ErrUnknownCheckpoint) && !errors.Is(err, owner.ErrInvalidRecord) {
			t.Errorf("%s: %v, want ErrUnknownCheckpoint or ErrInvalidRecord", name, err)
		}
	}
	if n := e.fk.Stats().LiveSandboxes; n != 0 {
		t.Fatalf("refused restores forked %d sandboxes", n)
	}
	none, err := o2.Restore(ctx, owner.RestoreRequest{CheckpointDir: "/d", Episodes: []string{"r9"}})
	if err != nil || len(none.Sessions) != 0 || none.CheckpointID != "c1" {
		t.Fatalf("restore of an episode the checkpoint lacks: %+v %v", none, err)
	}
	res, err := o2.Restore(ctx, owner.RestoreRequest{CheckpointDir: "/d", Episodes: []string{"r2", "r9"}})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range res.Sessions {
		got = append(got, s.SessionID+":"+s.Episode)
	}
	if diff := cmp.Diff([]string{"s2:r2"}, got); diff != "" || res.CheckpointID != "c1" {
		t.Fatalf("restore by dir of r2 (-want +got):\n%s (checkpoint %q)", diff, res.CheckpointID)
	}
}

// TestReleaseDefersSnapshotsTheProviderSaysAreInUse: a delete refused as in
// use is a pending delete, not a failure: the release succeeds at once, the
// tombstone stays (PendingDeletes counts it) and a later release deletes it.
func TestReleaseDefersSnapshotsTheProviderSaysAreInUse(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	seed(t, o, "s1")
	seed(t, o, "s2")
	commit(t, o, "c1")
	ck := loadCheckpoint(t, e, o, "c1")
	busy := ck.Records[0].SnapshotID
	// A sandbox the owner does not know of stands on the snapshot.
	fork, err := e.fk.Fork(context.Background(), provider.Spec{}, busy)
	if err != nil {
		t.Fatal(err)
	}
	res, err := o.Release(context.Background(), nil)
	if err != nil {
		t.Fatalf("a release with a snapshot in use failed: %v", err)
	}
	if diff := cmp.Diff([]string{busy}, res.Deferred); diff != "" || len(res.Deleted) != 1 || len(res.Failed) != 0 {
		t.Fatalf("release %+v: deferred (-want +got):\n%s", res, diff)
	}
	if n, err := o.PendingDeletes(); err != nil || n != 1 {
		t.Fatalf("PendingDeletes = %d, %v; want 1", n, err)
	}
	if err := e.fk.Stop(context.Background(), fork); err != nil {
		t.Fatal(err)
	}
	res, err = o.Release(context.Background(), nil)
	if err != nil || !cmp.Equal([]string{busy}, res.Deleted) {
		t.Fatalf("the next release: %+v, %v; want %s deleted", res, err, busy)
	}
	if n, _ := o.PendingDeletes(); n != 0 || e.fk.Stats().LiveSnapshots != 0 {
		t.Fatalf("after the next release: %d pending, %d snapshots", n, e.fk.Stats().LiveSnapshots)
	}
}

// TestRetireWaitsBehindAReleaseOnlyAsLongAsItsContext: a release holds
// the control turn while its snapshot delete is held by a hook; a retire
// whose context has ended meanwhile returns its context's error instead of
// waiting, and the release then finishes as before.
func TestRetireWaitsBehindAReleaseOnlyAsLongAsItsContext(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	seed(t, o, "s1")
	commit(t, o, "c1")
	entered, let := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.fk.SetHook(func(c fake.Call) {
		if c.Op == fake.OpDeleteSnapshot && c.Phase == fake.PhaseBegin {
			once.Do(func() {
				close(entered)
				<-let
			})
		}
	})
	released := make(chan error, 1)
	go func() {
		_, err := o.Release(context.Background(), nil)
		released <- err
	}()
	select {
	case <-entered:
	case <-time.After(time.Minute): // a guard against a hang, not a wait
		t.Fatal("the release never deleted a snapshot")
	}
	ctx, cancel := context.WithDeadline(context.Background(), e.clk.Now().Add(-time.Second))
	defer cancel()
	if _, err := o.Retire(ctx, []string{"s1"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a retire behind a running release: %v, want context.DeadlineExceeded", err)
	}
	close(let)
	select {
	case err := <-released:
		if err != nil {
			t.Fatalf("the release: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the release never finished")
	}
	if res, err := o.Retire(context.Background(), []string{"s1"}); err != nil || !cmp.Equal([]string{"s1"}, res.Stopped) {
		t.Fatalf("a retire after the release: %+v, %v", res, err)
	}
}

// A restore whose context ends after its first fork restores nothing: the
// sessions whose turn never came count as failed (not as forks that were
// never asked for), the fork made is stopped, and no session is installed.
func TestRestoreCutByItsContextHalfWayRestoresNothing(t *testing.T) {
	e := newEnv(t)
	o2 := e.committedAndReopened(parallelism(1))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.fk.SetHook(func(c fake.Call) {
		if c.Op == fake.OpFork && c.Phase == fake.PhaseEnd {
			cancel()
		}
	})
	_, err := o2.Restore(ctx, owner.RestoreRequest{CheckpointID: "c1"})
	e.fk.SetHook(nil)
	if !errors.Is(err, owner.ErrRestoreFailed) {
		t.Fatalf("got %v, want ErrRestoreFailed", err)
	}
	// The refusal names the three sessions never forked, each with the
	// context's error, and not the one forked before the cut.
	if msg := err.Error(); !strings.Contains(msg, "3 of 4 forks failed: ") || strings.Count(msg, ": "+context.Canceled.Error()) != 3 {
		t.Errorf("the refusal %q does not name the three sessions never forked", msg)
	}
	if ids, _ := o2.Sessions(); len(ids) != 0 {
		t.Fatalf("a restore cut half way installed %v", ids)
	}
	if got := e.fk.Stats().LiveSandboxes; got != 0 {
		t.Fatalf("%d forks left running after a restore cut half way", got)
	}
}
