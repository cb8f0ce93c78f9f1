package swebench

import (
	"encoding/json"
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
	w := newWorld(t, tk)
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
	wantResolved(t, res)
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
	gymcheck.Verify(t, "base", body, r.body)
}
