package http_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/resources/notes"
)

func typedSeed(id string, episode any, taskset, task string) map[string]any {
	return map[string]any{
		"resources_session_id": id,
		"episode_id":           episode,
		"task_id":              map[string]any{"taskset": taskset, "task_id": task},
		"task_data":            map[string]any{"expected_notes": []string{"one"}},
	}
}

// TestTypedSeed: Gym's typed seed names the session, answers with the
// sandbox access /sandbox_access gives, is idempotent for the same episode
// and task, and is refused for another.
func TestTypedSeed(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	r := h.post(a, "/seed_session", typedSeed("s-1", ep("r1", 0), "notes", "t1"))
	got := h.ok(r, "typed seed")
	if r.header[httpapi.HeaderVerify] != "wait" {
		t.Errorf("typed seed reply headers %v", r.header)
	}
	if sessionID(a) != "s-1" {
		t.Errorf("the cookie names session %q, want the typed id", sessionID(a))
	}
	access := h.ok(h.post(a, "/sandbox_access", nil), "access")
	// The server's tools over MCP (TestMCPToolsOfATypedSession calls them).
	if tools, _ := got["resources_tools"].(map[string]any); tools["url_path"] != "/mcp" {
		t.Errorf("resources_tools %v", got["resources_tools"])
	}
	want := map[string]any{"resources_session_id": "s-1", "resources_tools": got["resources_tools"], "sandbox_access": access}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("typed seed reply (-want +got):\n%s", diff)
	}
	sb := h.sandboxID(a)

	// The longest typed id's cookie names it, as the shortest's does.
	for _, id := range []string{"x", strings.Repeat("x", httpapi.MaxSessionIDLen)} {
		b := &agent{}
		seeded := h.ok(h.post(b, "/seed_session", typedSeed(id, ep("r-"+id[:1], 0), "notes", "t1")), "typed seed of a "+id[:1]+" id")
		if diff := cmp.Diff(seeded["sandbox_access"], any(h.ok(h.post(b, "/sandbox_access", nil), "access by cookie"))); diff != "" {
			t.Errorf("a %d-character typed id: the cookie's session has another sandbox (-seed +access):\n%s", len(id), diff)
		}
		h.ok(h.post(nil, "/close_session", map[string]any{"resources_session_id": id}), "close")
	}

	// The same seed again (a retry) is the same session and sandbox.
	again := h.ok(h.post(&agent{}, "/seed_session", typedSeed("s-1", "r1", "notes", "t1")), "repeated typed seed")
	if diff := cmp.Diff(want, again); diff != "" {
		t.Errorf("repeated typed seed (-want +got):\n%s", diff)
	}
	if n := len(h.fake().LiveSandboxIDs()); n != 1 {
		t.Errorf("%d sandboxes after a repeated seed, want 1", n)
	}
	h.want(h.post(&agent{}, "/seed_session", typedSeed("s-1", ep("r1", 0), "notes", "t2")), 409, httpapi.CodeSessionConflict, "seed for another task")
	h.want(h.post(&agent{}, "/seed_session", typedSeed("s-1", ep("r2", 0), "notes", "t1")), 409, httpapi.CodeSessionConflict, "seed for another episode")

	// The episode is bound as a rollout prefix binds it: a commit exports it.
	h.ok(h.post(a, "/append_note", map[string]any{"line": "one"}), "append")
	h.ok(h.control("prepare", map[string]any{"checkpoint_id": "ck", "deadline_ts": h.deadline()}), "prepare")
	c := h.ok(h.control("commit", map[string]any{"checkpoint_id": "ck", "deadline_ts": h.deadline(), "checkpoint_dir": "/d"}), "commit")
	if diff := cmp.Diff([]any{"r1"}, c["episode_ids"]); diff != "" {
		t.Errorf("committed episodes (-want +got):\n%s", diff)
	}
	h.ok(h.control("resume", map[string]any{"checkpoint_id": "ck", "deadline_ts": h.deadline()}), "resume")

	// Cookie-bound routes reach the typed session; a typed close ends it and
	// fences the id.
	v := h.ok(h.post(a, "/verify", map[string]any{"expected_notes": []string{"one"}}), "verify")
	if v["reward"] != 1.0 {
		t.Errorf("verify of the typed session: %v", v)
	}
	if h.live(sb) {
		t.Errorf("verify left %s running", sb)
	}
	h.want(h.post(&agent{}, "/seed_session", typedSeed("s-1", ep("r1", 0), "notes", "t2")), 409, httpapi.CodeSessionConflict, "seed of a verified session for another task")
	closed := h.ok(h.post(nil, "/close_session", map[string]any{"resources_session_id": "s-1", "episode_id": ep("r1", 0)}), "typed close")
	if diff := cmp.Diff(map[string]any{"resources_session_id": "s-1"}, closed); diff != "" {
		t.Errorf("typed close's reply (-want +got):\n%s", diff)
	}
	h.want(h.post(&agent{}, "/seed_session", typedSeed("s-1", ep("r1", 0), "notes", "t1")), 409, httpapi.CodeSessionClosed, "seed of a closed typed session")
}

func TestTypedSeedRefusals(t *testing.T) {
	h := newHarness(t)
	good := typedSeed("s-2", ep("r1", 0), "notes", "t1")
	with := func(k string, v any) map[string]any {
		m := map[string]any{}
		for kk, vv := range good {
			m[kk] = vv
		}
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	cases := map[string]any{
		"an extra key":               with("extra", 1),
		"an extra key in task_id":    with("task_id", map[string]any{"taskset": "n", "task_id": "t", "x": 1}),
		"no task_id":                 with("task_id", nil),
		"an empty task_id":           with("task_id", map[string]any{"taskset": "", "task_id": "t"}),
		"no episode_id":              with("episode_id", nil),
		"a bad episode_id":           with("episode_id", map[string]any{"rollout_id": "r-a1", "attempt": 0}),
		"no task_data":               with("task_data", nil),
		"task_data not an object":    with("task_data", []int{1}),
		"an empty session id":        with("resources_session_id", ""),
		"a session id with a /":      with("resources_session_id", "a/b"),
		"a session id not a string":  with("resources_session_id", 5),
		"a 129-character session id": with("resources_session_id", strings.Repeat("i", httpapi.MaxSessionIDLen+1)),
	}
	for name, body := range cases {
		h.want(h.post(&agent{}, "/seed_session", body), 422, "invalid_request", "typed seed with "+name)
	}
	h.want(h.post(&agent{}, "/ng-rollout/r9/seed_session", good), 422, "invalid_request", "typed seed whose episode is not the prefix's")
	if n := len(h.fake().LiveSandboxIDs()); n != 0 {
		t.Errorf("refused seeds started %d sandboxes", n)
	}
	// The same seed under its own prefix is fine; a legacy row still seeds.
	h.ok(h.post(&agent{}, "/ng-rollout/r1/seed_session", good), "typed seed under its prefix")
	h.ok(h.post(&agent{}, "/seed_session", map[string]any{"instance_id": "x", "responses_create_params": map[string]any{}}), "legacy seed")
}

// replayable is the notes server declaring a replayable verify.
type replayable struct{ *notes.Server }

func (replayable) VerifyReplayable() bool { return true }

func TestLivenessAndReverifyMode(t *testing.T) {
	h := newHarness(t, checkpointOff())
	if got := h.ok(h.do(nil, "GET", "/", nil, nil), "GET /"); got["status"] != "ok" {
		t.Errorf("GET /: %v", got)
	}
	h.want(h.do(nil, "POST", "/", nil, nil), 405, httpapi.CodeMethod, "POST /")
	r := h.do(nil, "GET", "/reverify_mode", nil, nil)
	if r.status != 200 || string(r.body) != `"unsupported"` {
		t.Errorf("reverify_mode of notes: %d %s", r.status, r.body)
	}
	h.want(h.post(nil, "/reverify_mode", nil), 405, httpapi.CodeMethod, "POST /reverify_mode")
	h2 := newHarness(t, checkpointOff(), withResources(replayable{notes.New(notes.Options{})}))
	if r := h2.do(nil, "GET", "/reverify_mode", nil, nil); string(r.body) != `"stateless"` {
		t.Errorf("reverify_mode of a replayable verify: %s", r.body)
	}
}

// TestAggregateMetrics: the route answers the aggregate package's
// hand-computed example, and refuses what is not a list of responses.
func TestAggregateMetrics(t *testing.T) {
	h := newHarness(t)
	b, err := os.ReadFile(filepath.Join("..", "aggregate", "testdata", "example.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ex struct {
		Request json.RawMessage `json:"request"`
		Want    map[string]any  `json:"want"`
	}
	if err := json.Unmarshal(b, &ex); err != nil {
		t.Fatal(err)
	}
	a := &agent{}
	got := h.ok(h.post(a, "/aggregate_metrics", []byte(ex.Request)), "aggregate_metrics")
	if diff := cmp.Diff(ex.Want, got, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
		t.Errorf("aggregate (-want +got):\n%s", diff)
	}
	if a.cookie != "" {
		t.Errorf("aggregate_metrics started a session")
	}
	for _, body := range []string{`{}`, `{"verify_responses": {}}`, `{"verify_responses": [{"_ng_task_index": "a"}]}`, `{`} {
		h.want(h.post(nil, "/aggregate_metrics", body), 422, "invalid_request", "aggregate_metrics with "+body)
	}
	h.want(h.do(nil, "GET", "/aggregate_metrics", nil, nil), 405, httpapi.CodeMethod, "GET /aggregate_metrics")
}

// TestDescriptorWorkdirIsTheSpecs: a spec that names its workdir puts it in
// the descriptor.
func TestDescriptorWorkdirIsTheSpecs(t *testing.T) {
	h := newHarness(t, withResources(notes.New(notes.Options{Workdir: "/work"})))
	a := &agent{}
	h.ok(h.post(a, "/seed_session", nil), "seed")
	got := h.ok(h.post(a, "/sandbox_access", nil), "access")
	if d := got["connection"].(map[string]any)["descriptor"].(map[string]any); d["workdir"] != "/work" {
		t.Errorf("descriptor %v, want workdir /work", d)
	}
}
