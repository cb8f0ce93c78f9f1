package swebench_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxowner/owner/resources/swebench"
)

// agent is the controller and the agent of one episode over real HTTP.
type agent struct {
	t   *testing.T
	cl  *http.Client
	srv *child
}

func (a *agent) call(method, url, token string, body any) (int, map[string]any) {
	a.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			a.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := a.cl.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out
}

func (a *agent) ok(method, path, token string, body any) map[string]any {
	a.t.Helper()
	status, out := a.call(method, a.srv.base+path, token, body)
	if status != 200 {
		a.t.Fatalf("%s %s: %d %v", method, path, status, out)
	}
	return out
}

func (a *agent) control(op, id string, extra map[string]any) map[string]any {
	a.t.Helper()
	body := map[string]any{"checkpoint_id": id, "deadline_ts": float64(time.Now().Add(time.Minute).UnixMilli()) / 1000}
	for k, v := range extra {
		body[k] = v
	}
	return a.ok("POST", "/ng-control/v1/checkpoint/"+op, childToken, body)
}

// access is the session's sandbox: its id, exec endpoint and token.
func (a *agent) access() (id, endpoint, token string) {
	a.t.Helper()
	desc := a.ok("POST", "/sandbox_access", "", nil)["connection"].(map[string]any)["descriptor"].(map[string]any)
	return desc["sandbox_id"].(string), desc["endpoint"].(string), desc["token"].(string)
}

// agentCommandTimeout bounds an agent's command: long enough that a
// saturated machine cannot make a command the test needs time out (as
// agentTimeout in the package's own tests).
const agentCommandTimeout = 20 * time.Minute

// exec runs a command in the sandbox through its exec API.
func (a *agent) exec(endpoint, token, command string) (int, map[string]any) {
	a.t.Helper()
	return a.call("POST", endpoint+"/exec", token, map[string]any{"command": command, "timeout_ms": agentCommandTimeout.Milliseconds()})
}

func (a *agent) mustExec(endpoint, token, command string) string {
	a.t.Helper()
	status, out := a.exec(endpoint, token, command)
	if status != 200 || out["exit_code"] != 0.0 {
		a.t.Fatalf("exec %q: %d %v", command, status, out)
	}
	return out["stdout"].(string)
}

// TestSIGKILLBetweenCommitAndVerify: the server binary, as a real process, is
// killed with SIGKILL after a checkpoint; a fresh one restores it, the re-seed gets the
// fork with the agent's work as of the checkpoint, and verify grades it.
func TestSIGKILLBetweenCommitAndVerify(t *testing.T) {
	t.Parallel()
	tr := swebench.NewTaskRepo(t)
	cfg := childConfig(t, tr, t.TempDir(), t.TempDir())
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	// The first seed may build and validate the task's template: 5
	// minutes were not enough on a cold, loaded run, and a child stopped
	// mid-validation leaves its sandbox's mounts for the cleanup to
	// remove through. The bound only ends a hang.
	a := &agent{t: t, cl: &http.Client{Jar: jar, Timeout: 30 * time.Minute}, srv: startChild(t, cfg)}

	seed := a.ok("POST", "/ng-rollout/r1/seed_session", "", tr.MultilingualRow)
	old, endpoint, token := a.access()
	if seed["sandbox_handle"] != old {
		t.Fatalf("seed %v, access names %s", seed, old)
	}
	a.mustExec(endpoint, token, "git apply - <<'EOF'\n"+tr.Patch+"EOF\n")

	episodes := []any{map[string]any{"rollout_id": "r1", "attempt": 0}}
	ckDir := filepath.Join(t.TempDir(), "ck1")
	if p := a.control("prepare", "ck1", nil); p["phase"] != "prepared" {
		t.Fatalf("prepare: %v", p)
	}
	commit := a.control("commit", "ck1", map[string]any{"checkpoint_dir": ckDir, "episode_ids": episodes})
	if commit["phase"] != "committed" || commit["manifest"].(map[string]any)["record_count"] != 1.0 {
		t.Fatalf("commit: %v", commit)
	}
	a.control("resume", "ck1", nil)
	// Drift after the checkpoint: the fix is undone and the build broken.
	a.mustExec(endpoint, token, "git checkout -- calc.go && echo 'func broken(' >> calc.go")

	a.srv.stop(t, syscall.SIGKILL)
	a.srv = startChild(t, cfg)

	restore := a.control("restore", "ck1", map[string]any{"checkpoint_dir": ckDir, "episode_ids": episodes})
	if restore["phase"] != "restored" {
		t.Fatalf("restore: %v", restore)
	}
	a.control("resume", "ck1", nil)
	// The old sandbox's token is told to ask again, not silently served.
	if status, out := a.exec(a.srv.base+"/sandboxes/"+old, token, "true"); status != 410 {
		t.Errorf("exec with the superseded sandbox's token: %d %v, want 410", status, out)
	}
	again := a.ok("POST", "/ng-rollout/r1-a1/seed_session", "", tr.MultilingualRow)
	fork, forkEndpoint, forkToken := a.access()
	if again["restored"] != true || again["sandbox_handle"] != fork || fork == old {
		t.Fatalf("re-seed after restore: %v (old %s, access %s)", again, old, fork)
	}
	if got := a.mustExec(forkEndpoint, forkToken, "cat calc.go"); !strings.Contains(got, "return -x") || strings.Contains(got, "broken") {
		t.Errorf("the fork's calc.go is not the checkpointed work:\n%s", got)
	}
	res := a.ok("POST", "/ng-rollout/r1-a1/verify", "", tr.MultilingualRow)
	if res["reward"] != 1.0 || res["resolved"] != true {
		b, _ := json.MarshalIndent(res, "", "  ")
		t.Fatalf("verify after the restore:\n%s", b)
	}
	if status, _ := a.call("POST", a.srv.base+"/verify", "", tr.MultilingualRow); status != 409 {
		t.Errorf("a second verify: %d, want 409", status)
	}
}
