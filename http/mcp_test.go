package http_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"

	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/resources"
	"github.com/sandboxowner/owner/resources/notes"
)

// TestMCPToolsOfATypedSession: the typed seed hands out resources_tools;
// with its header, /mcp lists the server's tools and a tools/call runs
// append_note in the session, as the route would; a call without the
// token is 401, and a call of a retired attempt is stale.
func TestMCPToolsOfATypedSession(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	seed := h.ok(h.post(a, "/seed_session", typedSeed("s-1", ep("r7", 0), "notes", "t1")), "typed seed")
	tools, _ := seed["resources_tools"].(map[string]any)
	hdrs, _ := tools["headers"].(map[string]any)
	tok, _ := hdrs[httpapi.HeaderMCPSession].(string)
	if tools["server_name"] != "notes" || tools["url_path"] != "/mcp" || tools["transport"] != "http" || tok == "" {
		t.Fatalf("resources_tools %v", seed["resources_tools"])
	}
	rpc := func(method string, params any, token string) reply {
		t.Helper()
		hdr := map[string]string{}
		if token != "" {
			hdr[httpapi.HeaderMCPSession] = token
		}
		return h.do(nil, "POST", "/mcp", map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, hdr)
	}
	init := h.ok(rpc("initialize", map[string]any{"protocolVersion": "2025-03-26"}, tok), "initialize")
	if r := init["result"].(map[string]any); r["protocolVersion"] != "2025-03-26" {
		t.Errorf("initialize: %v", init)
	}
	list := h.ok(rpc("tools/list", nil, tok), "tools/list")
	var names []string
	for _, tl := range list["result"].(map[string]any)["tools"].([]any) {
		names = append(names, tl.(map[string]any)["name"].(string))
	}
	if diff := cmp.Diff([]string{"append_note"}, names); diff != "" {
		t.Errorf("tools (-want +got):\n%s", diff)
	}
	call := h.ok(rpc("tools/call", map[string]any{"name": "append_note", "arguments": map[string]any{"line": "over mcp"}}, tok), "tools/call")
	res := call["result"].(map[string]any)
	if res["isError"] != false || !cmp.Equal(res["structuredContent"], map[string]any{"success": true}) {
		t.Errorf("tools/call: %v", call)
	}
	// The note is in the session's sandbox: verify (by the cookie) sees it.
	v := h.ok(h.post(a, "/verify", map[string]any{"expected_notes": []string{"over mcp"}}), "verify")
	if v["reward"] != 1.0 {
		t.Errorf("verify after the MCP call: %v", v)
	}
	// A tool's own failure is a result with isError (the session has no
	// sandbox any more).
	failed := h.ok(rpc("tools/call", map[string]any{"name": "append_note", "arguments": map[string]any{"line": "x"}}, tok), "tools/call after verify")
	res = failed["result"].(map[string]any)
	var env struct {
		Error struct{ Code string } `json:"error"`
	}
	_ = json.Unmarshal([]byte(res["content"].([]any)[0].(map[string]any)["text"].(string)), &env)
	if res["isError"] != true || env.Error.Code != httpapi.CodeNoSessionSandbox {
		t.Errorf("tools/call without a sandbox: %v", failed)
	}
	h.want(rpc("tools/call", map[string]any{"name": "append_note", "arguments": map[string]any{}}, ""), 401, "unauthorized", "no token")
	h.want(rpc("tools/call", map[string]any{"name": "append_note", "arguments": map[string]any{}}, a.cookie), 401, "unauthorized", "a cookie is no token")
	if r := h.ok(rpc("tools/call", map[string]any{"name": "verify"}, tok), "a reserved name"); r["error"] == nil {
		t.Errorf("tools/call of verify: %v", r)
	}

	b := &agent{}
	seed = h.ok(h.post(b, "/seed_session", typedSeed("s-2", ep("r8", 0), "notes", "t2")), "typed seed r8")
	tok2 := seed["resources_tools"].(map[string]any)["headers"].(map[string]any)[httpapi.HeaderMCPSession].(string)
	h.ok(h.control("retire", map[string]any{"checkpoint_id": "rt", "deadline_ts": h.deadline(), "episode_ids": []any{ep("r8", 0)}}), "retire r8")
	h.want(rpc("tools/call", map[string]any{"name": "append_note", "arguments": map[string]any{"line": "x"}}, tok2), 409, "stale_attempt", "a retired attempt over MCP")
}

// loggingTool is notes with a tool that logs through the session's logger,
// as resources servers do.
type loggingTool struct{ *notes.Server }

func (l loggingTool) Tools() map[string]resources.ToolFunc {
	tools := l.Server.Tools()
	tools["/log_me"] = func(_ context.Context, sess *resources.Session, _ []byte) (any, error) {
		sess.Log.Info("the tool ran")
		return map[string]bool{"ok": true}, nil
	}
	return tools
}

// TestMCPToolLinesCarryTheRequest: a line a tool logs over MCP names the
// request (its X-Request-Id), the session and its episode, as over the
// tool's route.
func TestMCPToolLinesCarryTheRequest(t *testing.T) {
	h := newHarness(t, withResources(loggingTool{notes.New(notes.Options{})}))
	a := &agent{}
	seed := h.ok(h.post(a, "/seed_session", typedSeed("s-1", ep("r7", 0), "notes", "t1")), "typed seed")
	tok := seed["resources_tools"].(map[string]any)["headers"].(map[string]any)[httpapi.HeaderMCPSession].(string)
	h.ok(h.do(nil, "POST", "/mcp", map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{"name": "log_me", "arguments": map[string]any{}}},
		map[string]string{httpapi.HeaderMCPSession: tok, httpapi.HeaderRequestID: "mcp-call-1"}), "tools/call")
	var line logrus.Fields
	for _, e := range h.log.AllEntries() {
		if e.Message == "the tool ran" {
			line = e.Data
		}
	}
	want := logrus.Fields{"request_id": "mcp-call-1", "session_id": "s-1", "capture_key": "r7"}
	got := logrus.Fields{}
	for k := range want {
		got[k] = line[k]
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the tool's line (-want +got):\n%s\nline: %v", diff, line)
	}
}

// TestMCPToolFailures: a tool failing over MCP answers a tool error naming
// its code, under the call's id; a failure with a 5xx is logged as an error, a 4xx is not.
func TestMCPToolFailures(t *testing.T) {
	h := newHarness(t, withResources(boom{notes.New(notes.Options{})}))
	seed := h.ok(h.post(&agent{}, "/seed_session", typedSeed("s-1", ep("r7", 0), "notes", "t1")), "typed seed")
	tok := seed["resources_tools"].(map[string]any)["headers"].(map[string]any)[httpapi.HeaderMCPSession].(string)
	for _, status := range []int{499, 500} {
		r := h.ok(h.do(nil, "POST", "/mcp", map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{"name": "fail", "arguments": map[string]any{"Status": status}}},
			map[string]string{httpapi.HeaderMCPSession: tok}), "tools/call")
		res, _ := r["result"].(map[string]any)
		content, _ := res["content"].([]any)
		if r["id"] != 1.0 || res["isError"] != true || len(content) != 1 || !strings.Contains(fmt.Sprint(content[0]), `"code":"failed"`) {
			t.Errorf("a tool failing with %d: %v", status, r)
		}
	}
	n := 0
	for _, e := range h.log.AllEntries() {
		if e.Message == "MCP tool call failed" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d failures logged, want the 500's alone", n)
	}
}
