package process_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNotesWalkThroughInContainers runs the real binary on the local
// provider with the default isolation, on a PATH that holds no
// bubblewrap (nor anything else), and walks notes sessions through a
// checkpoint: seed, a note, commands through the sandbox API (as nobody,
// with no capabilities, blind to the server's state), prepare, commit, a
// SIGKILL, a restore on a fresh server, and a verify of every fork. The
// server makes its sandboxes' containers itself, its own binary their init.
func TestNotesWalkThroughInContainers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the server as a process")
	}
	t.Parallel()
	dir := t.TempDir()
	// The server's PATH only: the test's own runs alongside others that
	// need theirs.
	env := []string{"PATH=" + t.TempDir()}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	// The server's own binary is the init, as with go run ./cmd/server:
	// nothing else to build or configure.
	local := []string{"-sandbox.provider", "local", "-sandbox.local.init_binary", ""}
	s := startWithEnv(t, dir, env, local...)
	if code, h, err := s.call(nil, "GET", "/health", nil); err != nil || code != 200 || h["isolation"] != "container" {
		t.Fatalf("health: %d %v %v\n%s", code, h, err, s.log)
	}
	secret := filepath.Join(dir, "session_secret")
	agents := []*agent{newAgent(), newAgent()}
	for i, a := range agents {
		r := fmt.Sprintf("r%d", i)
		s.ok(a, "/ng-rollout/"+r+"/seed_session", map[string]any{"instance_id": fmt.Sprintf("row-%d", i)})
		s.ok(a, "/ng-rollout/"+r+"/append_note", map[string]any{"line": "one"})
		desc := descriptor(t, s, a, r)
		code, m := sandboxExec(t, desc, "cat notes.txt; grep -E '^(Uid|CapEff):' /proc/self/status | tr -s '\\t' ' '")
		if want := "one\nUid: 0 0 0 0\nCapEff: 0000000000000000\n"; code != 200 || m["stdout"] != want {
			t.Fatalf("exec in the sandbox: %d %v, want stdout %q", code, m, want)
		}
		if code, m := sandboxExec(t, desc, "cat "+secret); code != 200 || m["exit_code"] == 0.0 || strings.Contains(fmt.Sprint(m["stdout"]), "=") {
			t.Fatalf("the sandbox read the server's session secret: %d %v", code, m)
		}
	}
	if code, m, err := s.control("prepare", map[string]any{"checkpoint_id": "ck1"}); err != nil || code != 200 || m["phase"] != "prepared" {
		t.Fatalf("prepare: %d %v %v", code, m, err)
	}
	if code, m, err := s.control("commit", map[string]any{"checkpoint_id": "ck1", "checkpoint_dir": filepath.Join(dir, "ctl-ck1"), "episode_ids": episodes(len(agents), 0)}); err != nil || code != 200 {
		t.Fatalf("commit: %d %v %v", code, m, err)
	}
	s.kill()

	s = startWithEnv(t, dir, env, local...)
	code, _, err := s.control("restore", map[string]any{"checkpoint_id": "ck1", "checkpoint_dir": filepath.Join(dir, "ctl-ck1"), "episode_ids": episodes(len(agents), 0)})
	if err != nil || code != 200 {
		t.Fatalf("restore: %d %v\n%s", code, err, s.log)
	}
	checkRestored(t, s, agents, code, func(a *agent, r string) {
		desc := descriptor(t, s, a, r)
		if code, m := sandboxExec(t, desc, "cat notes.txt && echo two >> notes.txt"); code != 200 || m["stdout"] != "one\n" || m["exit_code"] != 0.0 {
			t.Errorf("the fork in its container: %d %v", code, m)
		}
		if code, m := sandboxExec(t, desc, "sed -i '$d' notes.txt"); code != 200 || m["exit_code"] != 0.0 {
			t.Errorf("the fork's tree is not the sandbox's to write: %d %v", code, m)
		}
	})
	if code, m, err := s.control("release", map[string]any{"kept_checkpoint_ids": []string{}}); err != nil || code != 200 {
		t.Errorf("release: %d %v %v", code, m, err)
	}
	s.term()
}
