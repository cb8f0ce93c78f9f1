package owner_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/hangguard"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/records"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/snapshotindex"
)

type env struct {
	t   *testing.T
	fk  *fake.Provider
	dir string
	// ckdirs holds the controller's checkpoint directories ("/d").
	ckdirs *records.MemFS
	clk    *clock.Manual
	hook   *logtest.Hook
	// disarm stops the hang guard newEnv armed.
	disarm func() bool
}

func newEnv(t *testing.T) *env {
	t.Helper()
	disarm := hangguard.Arm(t) // a reply never sent or a timer never armed would hang the binary
	clk := clock.NewManual(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))
	return &env{t: t, fk: fake.New(fake.Options{Clock: clk, Seed: 1}), dir: t.TempDir(), ckdirs: records.NewMemFS(), clk: clk, disarm: disarm}
}

type cfgOpt func(*owner.Config)

func parallelism(n int) cfgOpt { return func(c *owner.Config) { c.Checkpoint.Parallelism = n } }
func onStop(s string) cfgOpt   { return func(c *owner.Config) { c.Checkpoint.OnStop = s } }
func roundTimeout(d time.Duration) cfgOpt {
	return func(c *owner.Config) { c.Checkpoint.RoundTimeout = d }
}

func (e *env) config(opts ...cfgOpt) owner.Config {
	lg, hook := logtest.NewNullLogger()
	lg.SetLevel(logrus.DebugLevel)
	e.hook = hook
	c := owner.Config{
		Name:       "notes",
		Provider:   e.fk,
		Checkpoint: owner.CheckpointConfig{Enabled: true, StateDir: e.dir, Records: e.ckdirs},
		Clock:      e.clk,
		Logger:     lg,
	}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// open starts an owner on the env's fake and state dir; the test closes it.
func (e *env) open(opts ...cfgOpt) *owner.Owner {
	e.t.Helper()
	o, err := owner.New(context.Background(), e.config(opts...))
	if err != nil {
		e.t.Fatalf("owner.New: %v", err)
	}
	e.t.Cleanup(func() { _ = o.Close() })
	return o
}

// notesSetup writes a token file and returns it as session data.
func notesSetup(token string) sandbox.SetupFunc {
	return func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) (json.RawMessage, error) {
		if err := p.WriteFile(ctx, sb.Handle, ".seed_token", []byte(token)); err != nil {
			return nil, err
		}
		return json.RawMessage(fmt.Sprintf(`{"seed_token":%q}`, token)), nil
	}
}

func seed(t *testing.T, o *owner.Owner, sid string) sandbox.Sandbox {
	t.Helper()
	sb, err := o.StartSessionSandbox(context.Background(), sid, provider.Spec{Image: "notes"}, notesSetup("tok-"+sid), "")
	if err != nil {
		t.Fatalf("seed %s: %v", sid, err)
	}
	return sb
}

// appendNote appends a line to notes.txt through the session's sandbox.
func appendNote(t *testing.T, o *owner.Owner, sid, line string) {
	t.Helper()
	err := o.Do(context.Background(), sid, func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) error {
		res, err := p.Exec(ctx, sb.Handle, provider.ExecRequest{Command: fmt.Sprintf("echo %s >> notes.txt", line)})
		if err != nil {
			return err
		}
		if res.ExitCode != 0 {
			return fmt.Errorf("echo exited %d: %s", res.ExitCode, res.Stderr)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("append %q to %s: %v", line, sid, err)
	}
}

func notes(t *testing.T, o *owner.Owner, sid string) []string {
	t.Helper()
	var out []string
	err := o.Do(context.Background(), sid, func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) error {
		b, err := p.ReadFile(ctx, sb.Handle, "notes.txt")
		if err != nil {
			return err
		}
		out = strings.Fields(string(b))
		return nil
	})
	if err != nil {
		t.Fatalf("read notes of %s: %v", sid, err)
	}
	return out
}

func commit(t *testing.T, o *owner.Owner, id string) owner.CommitResult {
	t.Helper()
	res, err := o.Commit(context.Background(), owner.CommitRequest{CheckpointID: id})
	if err != nil {
		t.Fatalf("commit %s: %v", id, err)
	}
	return res
}

// checkConsistent asserts the storm invariant: every snapshot the index
// names exists, and every snapshot that exists is named or tombstoned.
func checkConsistent(t *testing.T, fk *fake.Provider, dir string) {
	t.Helper()
	idx, err := snapshotindex.Open(dir, snapshotindex.Options{})
	if err != nil {
		t.Fatalf("open index: %v", err)
	}
	defer idx.Close()
	refs, err := idx.ReferencedSnapshots()
	if err != nil {
		t.Fatal(err)
	}
	ts, err := idx.Tombstones()
	if err != nil {
		t.Fatal(err)
	}
	tomb := map[string]bool{}
	for _, x := range ts {
		tomb[x.SnapshotID] = true
	}
	exists := map[string]bool{}
	for _, id := range fk.SnapshotIDs() {
		exists[id] = true
		if len(refs[id]) == 0 && !tomb[id] {
			t.Errorf("snapshot %s exists but no checkpoint names it and no tombstone covers it", id)
		}
	}
	var missing []string
	for id := range refs {
		if !exists[id] {
			missing = append(missing, id)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("the index names snapshots that do not exist: %v", missing)
	}
}

// onlyRoundsOf reports whether the intents are at most o's standing rounds
// intent (the one every exporting owner holds while it runs).
func onlyRoundsOf(in []snapshotindex.Intent, o *owner.Owner) bool {
	for _, i := range in {
		if i.Kind != "rounds" || i.ID != o.Incarnation() {
			return false
		}
	}
	return true
}

func warnings(h *logtest.Hook, substr string) int {
	n := 0
	for _, e := range h.AllEntries() {
		if e.Level == logrus.WarnLevel && strings.Contains(e.Message, substr) {
			n++
		}
	}
	return n
}
