package process_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
)

// movedSecret is the session secret both servers are configured with: the
// generated one lives in the state_dir that the machine took with it.
const movedSecret = "moved-secret-0123456789"

// TestRestoreOnAnotherMachine: sessions seed and write a note, the server
// commits into the controller's checkpoint_dir and is SIGKILLed, and its
// state_dir is deleted (the machine is gone). A server on a fresh state_dir
// restores from the checkpoint_dir alone and every episode verifies to 1.0:
// on OpenSandbox (whose snapshots outlive the machine) and on the local
// provider with a shared snapshot_dir. Without one, the restore is refused
// with 422 naming the snapshots it cannot find.
func TestRestoreOnAnotherMachine(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the server as a process")
	}
	t.Parallel()
	const sessions = 3
	// Local sandboxes are copies (overlay off): the gone machine's root is
	// deleted, and an overlay mount would keep its directory.
	for _, tc := range []struct {
		name    string
		start   func(t *testing.T, stateDir string) *server
		refused bool
	}{
		{"local-snapshot-dir", func() func(*testing.T, string) *server {
			var shared string
			return func(t *testing.T, stateDir string) *server {
				if shared == "" {
					shared = t.TempDir()
				}
				return startWith(t, stateDir, "-sandbox.provider", "local", "-sandbox.local.isolation", "none", "-sandbox.local.overlay", "off",
					"-sandbox.local.snapshot_dir", shared, "-session_secret", movedSecret)
			}
		}(), false},
		{"local-without-snapshot-dir", func(t *testing.T, stateDir string) *server {
			return startWith(t, stateDir, "-sandbox.provider", "local", "-sandbox.local.isolation", "none", "-sandbox.local.overlay", "off", "-session_secret", movedSecret)
		}, true},
		{"opensandbox", func() func(*testing.T, string) *server {
			var srv *opensandboxtest.Server
			return func(t *testing.T, stateDir string) *server {
				if srv == nil {
					srv = opensandboxtest.NewServer(opensandboxtest.Options{APIKey: osbKey, CreateLatency: osbLatency, SnapshotLatency: osbLatency})
					t.Cleanup(srv.Close)
				}
				return startOSB(t, stateDir, srv.Domain, "-session_secret", movedSecret)
			}
		}(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ckDir := filepath.Join(t.TempDir(), "ck1")
			first := t.TempDir()
			s := tc.start(t, first)
			agents := make([]*agent, sessions)
			for i := range agents {
				agents[i] = newAgent()
				r := fmt.Sprintf("r%d", i)
				s.ok(agents[i], "/ng-rollout/"+r+"/seed_session", map[string]any{"instance_id": fmt.Sprintf("row-%d", i)})
				s.ok(agents[i], "/ng-rollout/"+r+"/append_note", map[string]any{"line": "one"})
			}
			if code, m, err := s.control("prepare", map[string]any{"checkpoint_id": "ck1"}); err != nil || code != 200 {
				t.Fatalf("prepare: %d %v %v", code, m, err)
			}
			code, m, err := s.control("commit", map[string]any{"checkpoint_id": "ck1", "checkpoint_dir": ckDir, "episode_ids": episodes(sessions, 0)})
			if err != nil || code != 200 {
				t.Fatalf("commit: %d %v %v", code, m, err)
			}
			manifest, _ := m["manifest"].(map[string]any)
			if manifest["records_file"] == nil || manifest["record_count"] != float64(sessions) {
				t.Fatalf("commit manifest: %v", m)
			}
			if _, err := os.Stat(filepath.Join(ckDir, "gym", "resources", "notes", manifest["records_file"].(string))); err != nil {
				t.Fatalf("the records file the manifest names: %v", err)
			}
			s.kill()
			if err := os.RemoveAll(first); err != nil {
				t.Fatal(err)
			}

			s = tc.start(t, t.TempDir())
			start := time.Now()
			code, m, err = s.control("restore", map[string]any{"checkpoint_id": "ck1", "checkpoint_dir": ckDir, "episode_ids": episodes(sessions, 0)})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("restore on the fresh state_dir: %d in %v", code, time.Since(start))
			if tc.refused {
				e, _ := m["error"].(map[string]any)
				if detail, _ := e["detail"].(string); code != 422 || e["code"] != "invalid_checkpoint_state" || !strings.Contains(detail, "does not have snapshot(s) snap-") {
					t.Fatalf("restore without the snapshots: %d %v", code, m)
				}
				return
			}
			if code != 200 {
				t.Fatalf("restore: %d %v\n%s", code, m, lastLines(s.log.String(), 30))
			}
			checkRestored(t, s, agents, code, nil)
			if code, m, err := s.control("release", map[string]any{"kept_checkpoint_ids": []string{}}); err != nil || code != 200 {
				t.Errorf("release: %d %v %v", code, m, err)
			}
			s.term()
		})
	}
}

// TestManyOwnersOneLost: three owners of one notes server (names notes-0,
// notes-1, notes-2; local sandboxes with a shared snapshot_dir) each hold
// their own sessions and commit into the same checkpoint_dir, each under
// its own instance. The episodes move on; notes-1 is SIGKILLed and its
// state_dir deleted; a replacement under the same name on a fresh
// state_dir restores its own records. Its episodes verify as of the
// checkpoint at their next attempt, the others' as they went on: every
// episode to 1.0.
func TestManyOwnersOneLost(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the server as a process")
	}
	t.Parallel()
	const owners, perOwner = 3, 2
	shared, ckDir := t.TempDir(), filepath.Join(t.TempDir(), "ck1")
	startOwner := func(i int, stateDir string) *server {
		return startWith(t, stateDir, "-name", fmt.Sprintf("notes-%d", i), "-sandbox.provider", "local",
			"-sandbox.local.isolation", "none", "-sandbox.local.overlay", "off", "-sandbox.local.snapshot_dir", shared,
			"-session_secret", movedSecret)
	}
	rollout := func(i, j int) string { return fmt.Sprintf("o%dr%d", i, j) }
	eps := func(i, attempt int) []any {
		var out []any
		for j := 0; j < perOwner; j++ {
			out = append(out, map[string]any{"rollout_id": rollout(i, j), "attempt": attempt})
		}
		return out
	}
	srvs := make([]*server, owners)
	states := make([]string, owners)
	agents := make([][]*agent, owners)
	for i := range srvs {
		states[i] = t.TempDir()
		srvs[i] = startOwner(i, states[i])
		for j := 0; j < perOwner; j++ {
			a := newAgent()
			agents[i] = append(agents[i], a)
			srvs[i].ok(a, "/ng-rollout/"+rollout(i, j)+"/seed_session", map[string]any{"instance_id": "row"})
			srvs[i].ok(a, "/ng-rollout/"+rollout(i, j)+"/append_note", map[string]any{"line": "one"})
		}
	}
	for i, s := range srvs {
		if code, m, err := s.control("prepare", map[string]any{"checkpoint_id": "ck1"}); err != nil || code != 200 {
			t.Fatalf("prepare notes-%d: %d %v %v", i, code, m, err)
		}
	}
	for i, s := range srvs {
		code, m, err := s.control("commit", map[string]any{"checkpoint_id": "ck1", "checkpoint_dir": ckDir, "episode_ids": eps(i, 0)})
		if err != nil || code != 200 {
			t.Fatalf("commit notes-%d: %d %v %v", i, code, m, err)
		}
		if man, _ := m["manifest"].(map[string]any); man["instance"] != fmt.Sprintf("notes-%d", i) || man["record_count"] != float64(perOwner) {
			t.Fatalf("commit notes-%d manifest: %v", i, m)
		}
	}
	for i, s := range srvs {
		if code, m, err := s.control("resume", map[string]any{"checkpoint_id": "ck1"}); err != nil || code != 200 {
			t.Fatalf("resume notes-%d: %d %v %v", i, code, m, err)
		}
		for j, a := range agents[i] {
			s.ok(a, "/ng-rollout/"+rollout(i, j)+"/append_note", map[string]any{"line": "two"})
		}
	}

	const lost = 1
	srvs[lost].kill()
	if err := os.RemoveAll(states[lost]); err != nil {
		t.Fatal(err)
	}
	s := startOwner(lost, t.TempDir())
	srvs[lost] = s
	code, m, err := s.control("restore", map[string]any{"checkpoint_id": "ck1", "checkpoint_dir": ckDir, "episode_ids": eps(lost, 0)})
	if err != nil || code != 200 {
		t.Fatalf("restore notes-%d: %d %v %v\n%s", lost, code, m, err, lastLines(s.log.String(), 30))
	}
	if code, m, err := s.control("resume", map[string]any{"checkpoint_id": "ck1"}); err != nil || code != 200 {
		t.Fatalf("resume after the restore: %d %v %v", code, m, err)
	}
	for i, s := range srvs {
		for j, a := range agents[i] {
			key, want := rollout(i, j), []string{"one", "two"}
			if i == lost {
				key, want = key+"-a1", []string{"one"}
				s.ok(a, "/ng-rollout/"+key+"/seed_session", map[string]any{"instance_id": "row"})
			}
			if v := s.ok(a, "/ng-rollout/"+key+"/verify", map[string]any{"expected_notes": want}); v["reward"] != 1.0 {
				t.Errorf("notes-%d %s verified %v", i, key, v)
			}
		}
	}
	for i, s := range srvs {
		if code, m, err := s.control("release", map[string]any{"kept_checkpoint_ids": []string{}}); err != nil || code != 200 {
			t.Errorf("release notes-%d: %d %v %v", i, code, m, err)
		}
		s.term()
	}
}
