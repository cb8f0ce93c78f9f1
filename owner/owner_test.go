package owner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
)

func TestStartTwiceIsTyped(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	seed(t, o, "s1")
	_, err := o.StartSessionSandbox(context.Background(), "s1", provider.Spec{}, nil, "")
	if !errors.Is(err, sandbox.ErrExists) {
		t.Fatalf("second start: got %v, want sandbox.ErrExists", err)
	}
	if got := e.fk.Stats().LiveSandboxes; got != 1 {
		t.Fatalf("live sandboxes = %d, want 1", got)
	}
}

func TestWorkdirDefaultsToPwdAndDataRoundTrips(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	sb := seed(t, o, "s1")
	if sb.Workdir != fake.DefaultWorkdir {
		t.Fatalf("workdir = %q, want %q", sb.Workdir, fake.DefaultWorkdir)
	}
	if diff := cmp.Diff(`{"seed_token":"tok-s1"}`, string(o.SessionData(context.Background(), "s1"))); diff != "" {
		t.Fatalf("session data (-want +got):\n%s", diff)
	}
	// A setup that returns nothing gives {}.
	if _, err := o.StartSessionSandbox(context.Background(), "s2", provider.Spec{}, nil, "/w"); err != nil {
		t.Fatal(err)
	}
	if got := string(o.SessionData(context.Background(), "s2")); got != "{}" {
		t.Fatalf("data without setup = %s, want {}", got)
	}
	if got := string(o.SessionData(context.Background(), "nobody")); got != "{}" {
		t.Fatalf("data of unknown session = %s, want {}", got)
	}
}

func TestFailedSetupStopsSandboxAndTracksNothing(t *testing.T) {
	cases := map[string]sandbox.SetupFunc{
		"error": func(context.Context, provider.Provider, sandbox.Sandbox) (json.RawMessage, error) {
			return nil, errors.New("boom")
		},
		"not an object": func(context.Context, provider.Provider, sandbox.Sandbox) (json.RawMessage, error) {
			return json.RawMessage(`[1,2]`), nil
		},
		"too big": func(context.Context, provider.Provider, sandbox.Sandbox) (json.RawMessage, error) {
			return json.RawMessage(`{"x":"` + strings.Repeat("a", 70<<10) + `"}`), nil
		},
		"panic": func(context.Context, provider.Provider, sandbox.Sandbox) (json.RawMessage, error) {
			panic("setup exploded")
		},
	}
	for name, setup := range cases {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			o := e.open()
			_, err := o.StartSessionSandbox(context.Background(), "s1", provider.Spec{}, setup, "")
			if !errors.Is(err, sandbox.ErrSetup) {
				t.Fatalf("start: got %v, want sandbox.ErrSetup", err)
			}
			if got := e.fk.Stats().LiveSandboxes; got != 0 {
				t.Fatalf("live sandboxes after failed setup = %d, want 0", got)
			}
			if _, err := o.RequireSessionSandbox(context.Background(), "s1"); !errors.Is(err, sandbox.ErrNone) {
				t.Fatalf("require after failed setup: %v", err)
			}
			// No empty actor stays behind for the session.
			if ids, err := o.Sessions(); err != nil || len(ids) != 0 {
				t.Fatalf("sessions after a failed setup: %v %v", ids, err)
			}
			// Nothing can export it.
			res := commit(t, o, "c1")
			if len(res.Sessions) != 0 {
				t.Fatalf("exported %v after a failed setup", res.Sessions)
			}
			// And the session can be seeded again.
			seed(t, o, "s1")
		})
	}
}

func TestRequireWithoutSandboxIsTyped(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	if _, err := o.RequireSessionSandbox(context.Background(), "s1"); !errors.Is(err, sandbox.ErrNone) {
		t.Fatalf("got %v, want sandbox.ErrNone", err)
	}
	seed(t, o, "s1")
	if err := o.EndSessionSandbox(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := o.RequireSessionSandbox(context.Background(), "s1"); !errors.Is(err, sandbox.ErrNone) {
		t.Fatalf("after end: got %v, want sandbox.ErrNone", err)
	}
	err := o.Do(context.Background(), "s1", func(context.Context, provider.Provider, sandbox.Sandbox) error { return nil })
	if !errors.Is(err, sandbox.ErrNone) {
		t.Fatalf("Do after end: got %v", err)
	}
}

func TestEndIsIdempotentKeepsSnapshotsAndAllowsReseed(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	sb := seed(t, o, "s1")
	commit(t, o, "c1")
	for i := 0; i < 3; i++ {
		if err := o.EndSessionSandbox(context.Background(), "s1"); err != nil {
			t.Fatalf("end #%d: %v", i, err)
		}
	}
	if err := o.EndSessionSandbox(context.Background(), "never-seen"); err != nil {
		t.Fatalf("end of unknown session: %v", err)
	}
	st := e.fk.Stats()
	if st.LiveSandboxes != 0 || st.LiveSnapshots != 1 {
		t.Fatalf("after end: %d sandboxes, %d snapshots; want 0, 1", st.LiveSandboxes, st.LiveSnapshots)
	}
	if _, _, fate := o.SandboxFate(sb.Handle.SandboxID); fate != sandbox.FateEnded {
		t.Fatalf("fate of ended sandbox = %s", fate)
	}
	sb2 := seed(t, o, "s1")
	if sb2.Handle.SandboxID == sb.Handle.SandboxID {
		t.Fatal("re-seed after end reused the stopped sandbox")
	}
}

func TestConcurrentOperationsOnOneSessionAreSerialised(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	seed(t, o, "s1")
	var mu sync.Mutex
	inside, peak := 0, 0
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = o.Do(context.Background(), "s1", func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) error {
				mu.Lock()
				inside++
				if inside > peak {
					peak = inside
				}
				mu.Unlock()
				_, err := p.Exec(ctx, sb.Handle, provider.ExecRequest{Command: "echo x >> notes.txt"})
				mu.Lock()
				inside--
				mu.Unlock()
				return err
			})
		}()
	}
	wg.Wait()
	if peak != 1 {
		t.Fatalf("%d operations of one session ran at once, want 1", peak)
	}
	if got := len(notes(t, o, "s1")); got != 20 {
		t.Fatalf("%d notes, want 20", got)
	}
}

func TestModes(t *testing.T) {
	t.Run("off needs nothing", func(t *testing.T) {
		o, err := owner.New(context.Background(), owner.Config{Name: "x"})
		if err != nil {
			t.Fatal(err)
		}
		defer o.Close()
		if o.Mode() != owner.ModeOff {
			t.Fatalf("mode %s", o.Mode())
		}
		if _, err := o.Commit(context.Background(), owner.CommitRequest{CheckpointID: "c"}); !errors.Is(err, owner.ErrCheckpointingOff) {
			t.Fatalf("commit with checkpointing off: %v", err)
		}
	})
	t.Run("lends nothing: restart_only", func(t *testing.T) {
		o, err := owner.New(context.Background(), owner.Config{Name: "x", Checkpoint: owner.CheckpointConfig{Enabled: true}})
		if err != nil {
			t.Fatal(err)
		}
		defer o.Close()
		if o.Mode() != owner.ModeRestartOnly {
			t.Fatalf("mode %s", o.Mode())
		}
	})
	t.Run("a server that lends no sandboxes: restart_only, said as such, on a provider that can snapshot", func(t *testing.T) {
		e := newEnv(t)
		o, err := owner.New(context.Background(), e.config(func(c *owner.Config) { c.LendsNoSandboxes = true }))
		if err != nil {
			t.Fatal(err)
		}
		defer o.Close()
		if o.Mode() != owner.ModeRestartOnly {
			t.Fatalf("mode %s", o.Mode())
		}
		var msgs []string
		for _, en := range e.hook.AllEntries() {
			if strings.Contains(en.Message, "snapshot") || strings.Contains(en.Message, "restart_only") {
				msgs = append(msgs, en.Level.String()+": "+en.Message)
			}
		}
		want := []string{"info: notes: lends no sandboxes, so there is nothing to export: checkpoint mode restart_only"}
		if d := cmp.Diff(want, msgs); d != "" {
			t.Errorf("log (-want +got):\n%s", d)
		}
	})
	// A provider without snapshot calls, and one whose runtime refused them
	// at startup: restart_only with one warning, a commit records nothing
	// and touches no sandbox.
	for _, tc := range []struct {
		name string
		prov func() (provider.Provider, *fake.Provider)
		set  func(c *owner.Config, p provider.Provider)
		want string
	}{
		{
			name: "no snapshots",
			prov: func() (provider.Provider, *fake.Provider) {
				ns := fake.NewWithoutSnapshots(fake.Options{Name: "plain"})
				return ns, ns.Fake()
			},
			set:  func(c *owner.Config, p provider.Provider) { c.Provider = p },
			want: "notes: sandbox provider 'plain' cannot snapshot; its rollouts restart after a crash instead of continuing",
		},
		{
			name: "snapshots refused at startup",
			set: func(c *owner.Config, _ provider.Provider) {
				c.SnapshotsRefused = fmt.Errorf("HTTP 501 SNAPSHOT::NOT_IMPLEMENTED: %w", provider.ErrUnsupported)
			},
			want: "notes: sandbox provider 'fake' takes no snapshots (HTTP 501 SNAPSHOT::NOT_IMPLEMENTED: provider: unsupported); its rollouts restart after a crash instead of continuing",
		},
	} {
		t.Run(tc.name+": restart_only with one warning, commit records nothing", func(t *testing.T) {
			e := newEnv(t)
			var p provider.Provider
			fk := e.fk
			if tc.prov != nil {
				p, fk = tc.prov()
			}
			o, err := owner.New(context.Background(), e.config(func(c *owner.Config) { tc.set(c, p) }))
			if err != nil {
				t.Fatal(err)
			}
			defer o.Close()
			if o.Mode() != owner.ModeRestartOnly {
				t.Fatalf("mode %s", o.Mode())
			}
			if n := warnings(e.hook, tc.want); n != 1 {
				t.Fatalf("%d warnings %q, want exactly 1", n, tc.want)
			}
			if _, err := o.StartSessionSandbox(context.Background(), "s1", provider.Spec{}, nil, ""); err != nil {
				t.Fatal(err)
			}
			res, err := o.Commit(context.Background(), owner.CommitRequest{CheckpointID: "c1"})
			if err != nil || len(res.Sessions) != 0 || res.Mode != owner.ModeRestartOnly {
				t.Fatalf("restart_only commit: %+v, %v", res, err)
			}
			if st := fk.Stats(); st.LiveSandboxes != 1 || st.Calls[fake.OpSnapshot] != 0 {
				t.Fatalf("the in-flight sandbox was touched: %d live, %d snapshot calls", st.LiveSandboxes, st.Calls[fake.OpSnapshot])
			}
		})
	}
	t.Run("exported needs state_dir", func(t *testing.T) {
		e := newEnv(t)
		cfg := e.config(func(c *owner.Config) { c.Checkpoint.StateDir = "" })
		if _, err := owner.New(context.Background(), cfg); !errors.Is(err, owner.ErrConfig) || !strings.Contains(err.Error(), "state_dir") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("exported refuses num_workers > 1", func(t *testing.T) {
		e := newEnv(t)
		cfg := e.config(func(c *owner.Config) { c.NumWorkers = 2 })
		if _, err := owner.New(context.Background(), cfg); !errors.Is(err, owner.ErrConfig) || !strings.Contains(err.Error(), "num_workers") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("exported takes num_workers 1", func(t *testing.T) {
		e := newEnv(t)
		o, err := owner.New(context.Background(), e.config(func(c *owner.Config) { c.NumWorkers = 1 }))
		if err != nil {
			t.Fatal(err)
		}
		defer o.Close()
		if o.Mode() != owner.ModeExported {
			t.Fatalf("mode %s", o.Mode())
		}
	})
	t.Run("on_stop is validated", func(t *testing.T) {
		e := newEnv(t)
		if _, err := owner.New(context.Background(), e.config(onStop("pause"))); !errors.Is(err, owner.ErrConfig) {
			t.Fatalf("got %v", err)
		}
	})
}

// An ordinary seed whose start fails after the provider made the sandbox
// stops what the provider made: the seed fails and nothing is left running
// until a restart or a sweep.
func TestStartFailingAfterItsEffectLeavesNothing(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	a := seed(t, o, "a")
	e.fk.FailAfterEffect(fake.OpStart, 1)
	if _, err := o.StartSessionSandbox(context.Background(), "b", provider.Spec{Image: "notes"}, notesSetup("tok-b"), ""); !errors.Is(err, provider.ErrInjected) {
		t.Fatalf("got %v, want the injected start failure", err)
	}
	if d := cmp.Diff([]string{a.Handle.SandboxID}, e.fk.LiveSandboxIDs()); d != "" {
		t.Fatalf("live (-want +got):\n%s", d)
	}
	// The session may seed again once its failed start is cleaned up.
	b := seed(t, o, "b")
	if got := len(e.fk.LiveSandboxIDs()); got != 2 || b.Handle.SandboxID == "" {
		t.Fatalf("live sandboxes %d after the second seed of b, want 2", got)
	}
}

// SandboxFate tells of the last FateMemory sandboxes ended (by default
// many more than a few): an older one is unknown.
func TestSandboxFateRemembersFateMemoryEnds(t *testing.T) {
	for _, tc := range []struct {
		memory int
		want   []sandbox.Fate
	}{
		{0, []sandbox.Fate{sandbox.FateEnded, sandbox.FateEnded, sandbox.FateEnded}},
		{2, []sandbox.Fate{sandbox.FateUnknown, sandbox.FateEnded, sandbox.FateEnded}},
	} {
		e := newEnv(t)
		o := e.open(func(c *owner.Config) { c.Checkpoint.Enabled = false; c.FateMemory = tc.memory })
		var got []sandbox.Fate
		var ids []string
		for _, sid := range []string{"s1", "s2", "s3"} {
			sb, err := o.StartSessionSandbox(context.Background(), sid, provider.Spec{}, nil, "/w")
			if err != nil {
				t.Fatal(err)
			}
			if err := o.EndSessionSandbox(context.Background(), sid); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, sb.Handle.SandboxID)
		}
		for _, id := range ids {
			_, _, fate := o.SandboxFate(id)
			got = append(got, fate)
		}
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("FateMemory %d: fates of three ended sandboxes (-want +got):\n%s", tc.memory, d)
		}
	}
}
