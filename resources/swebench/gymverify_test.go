package swebench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/internal/gymcheck"
)

// A Gym agent sends the row with responses_create_params and response, and
// validates the reply as the request's model plus the grade: every field it
// sent comes back as sent.
func TestGymVerifyRoundTripOverHTTP(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	logs := t.TempDir()
	w := newWorld(t, tk, withConfig(func(c *Config) {
		// Validation off: what is tested is the reply's shape, and a
		// validation compiles the tests once more (minutes on a loaded
		// machine).
		c.LogDir, c.ClearSwebenchDebugLogs, c.Validate = logs, off(), off()
		// Graded or timed out, the reply has the same shape; TestOverHTTP
		// checks the grade itself.
		c.EvaluationTimeout = 1
	}))
	c := newHTTP(t, w.own, w.srv)
	req := tk.row("example__calc-1")
	req["responses_create_params"] = map[string]any{"input": []any{map[string]any{"role": "user", "content": "fix it"}}}
	req["response"] = map[string]any{"id": "resp_1", "output": []any{}, "model": "policy"}
	req["_ng_task_index"] = 2.0
	body := mustJSON(t, req)

	r := c.post("/ng-rollout/r-1/seed_session", body)
	var seed SeedResult
	if err := json.Unmarshal(r.body, &seed); err != nil || r.status != 200 || seed.SandboxHandle == nil {
		t.Fatalf("seed: %d %s", r.status, r.body)
	}
	w.applyAsAgent(*seed.SandboxHandle, tk.patch)
	r = c.post("/ng-rollout/r-1/verify", body)
	if r.status != 200 {
		t.Fatalf("verify: %d %s", r.status, r.body)
	}
	var res VerifyResult
	if err := json.Unmarshal(r.body, &res); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(r.body, &got); err != nil {
		t.Fatal(err)
	}
	echoed := map[string]any{}
	for k := range req {
		echoed[k] = got[k]
	}
	if d := cmp.Diff(json.RawMessage(body), json.RawMessage(mustJSON(t, echoed)), cmp.Transformer("json", func(b json.RawMessage) any {
		var v any
		_ = json.Unmarshal(b, &v)
		return v
	})); d != "" {
		t.Errorf("the request's fields in the reply (-sent +got):\n%s", d)
	}
	gymcheck.Verify(t, "swebench", body, r.body)
	// clear_swebench_debug_logs off: the grading's files are kept.
	if !strings.HasPrefix(res.LogDir, logs) {
		t.Fatalf("log_dir %q is not under %s", res.LogDir, logs)
	}
	for _, f := range []string{"report.json", "test_output.txt", "patch.diff"} {
		if _, err := os.Stat(filepath.Join(res.LogDir, f)); err != nil {
			t.Errorf("log_dir: %v", err)
		}
	}
}
