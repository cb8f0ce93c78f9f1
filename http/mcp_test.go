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
// as resources servers do, and one whose reply cannot be encoded.
type loggingTool struct{ *notes.Server }

func (l loggingTool) Tools() map[string]resources.ToolFunc {
	tools := l.Server.Tools()
	tools["/log_me"] = func(_ context.Context, sess *resources.Session, _ []byte) (any, error) {
		sess.Log.Info("the tool ran")
		return map[string]bool{"ok": true}, nil
	}
	tools["/unencodable"] = func(context.Context, *resources.Session, []byte) (any, error) {
		return map[string]any{"c": make(chan int)}, nil
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
	var logged []string
	for _, e := range h.log.AllEntries() {
		if e.Message == "MCP tool call failed" {
			logged = append(logged, fmt.Sprint(e.Data["error"]))
		}
	}
	if diff := cmp.Diff([]string{"failed: failed with 500"}, logged); diff != "" {
		t.Errorf("failures logged, want the 500's alone (-want +got):\n%s", diff)
	}
}

// TestMCPAnswersWhatIsNoToolCall: /mcp answers each malformed or other
// message as JSON-RPC says (the status, the error's code, the id echoed or
// null), a notification with 202 and no body, and initialize, ping and an
// unknown method as a client would see them.
func TestMCPAnswersWhatIsNoToolCall(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name   string
		body   string
		status int
		want   map[string]any // the reply, "" for no body
	}{
		{"not JSON", `{"jsonrpc":`, 400, map[string]any{"jsonrpc": "2.0", "id": nil, "error": map[string]any{"code": -32700.0}}},
		{"another version", `{"jsonrpc":"1.0","id":3,"method":"ping"}`, 400, map[string]any{"jsonrpc": "2.0", "id": 3.0, "error": map[string]any{"code": -32600.0}}},
		{"no method", `{"jsonrpc":"2.0","id":"a"}`, 400, map[string]any{"jsonrpc": "2.0", "id": "a", "error": map[string]any{"code": -32600.0}}},
		{"a notification", `{"jsonrpc":"2.0","method":"notifications/initialized"}`, 202, nil},
		{"ping", `{"jsonrpc":"2.0","id":4,"method":"ping"}`, 200, map[string]any{"jsonrpc": "2.0", "id": 4.0, "result": map[string]any{}}},
		{"initialize naming no version", `{"jsonrpc":"2.0","id":5,"method":"initialize"}`, 200, map[string]any{"jsonrpc": "2.0", "id": 5.0, "result": map[string]any{
			"protocolVersion": httpapi.MCPProtocolVersion,
			"capabilities":    map[string]any{"tools": map[string]any{"listChanged": false}},
			"serverInfo":      map[string]any{"name": "notes", "version": "1"},
		}}},
		{"an unknown method", `{"jsonrpc":"2.0","id":6,"method":"resources/list"}`, 200, map[string]any{"jsonrpc": "2.0", "id": 6.0, "error": map[string]any{"code": -32601.0}}},
		{"a call without params", `{"jsonrpc":"2.0","id":7,"method":"tools/call"}`, 200, map[string]any{"jsonrpc": "2.0", "id": 7.0, "error": map[string]any{"code": -32602.0}}},
		{"a call naming no tool", `{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"arguments":{}}}`, 200, map[string]any{"jsonrpc": "2.0", "id": 8.0, "error": map[string]any{"code": -32602.0}}},
		{"a call of no such tool", `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"nope"}}`, 200, map[string]any{"jsonrpc": "2.0", "id": 9.0, "error": map[string]any{"code": -32602.0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.do(nil, "POST", httpapi.RouteMCP, tc.body, nil)
			if tc.want == nil {
				if r.status != tc.status || len(r.body) != 0 {
					t.Fatalf("got %d %q, want %d and no body", r.status, r.body, tc.status)
				}
				return
			}
			got := r.json(t)
			if e, ok := got["error"].(map[string]any); ok {
				delete(e, "message") // the message is prose
			}
			if r.status != tc.status {
				t.Errorf("status %d, want %d", r.status, tc.status)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("reply (-want +got):\n%s", diff)
			}
		})
	}
	h.want(h.do(nil, "GET", httpapi.RouteMCP, nil, nil), 405, httpapi.CodeMethod, "GET /mcp")
}

// TestMCPToolArguments: a call's arguments left out or null run the tool
// with {}; arguments that are no object are invalid params; a tool whose
// reply cannot be encoded is the server's 500.
func TestMCPToolArguments(t *testing.T) {
	h := newHarness(t, withResources(loggingTool{notes.New(notes.Options{})}))
	seed := h.ok(h.post(&agent{}, "/seed_session", typedSeed("s-1", ep("r7", 0), "notes", "t1")), "typed seed")
	tok := seed["resources_tools"].(map[string]any)["headers"].(map[string]any)[httpapi.HeaderMCPSession].(string)
	call := func(params string) reply {
		t.Helper()
		return h.do(nil, "POST", httpapi.RouteMCP, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":`+params+`}`,
			map[string]string{httpapi.HeaderMCPSession: tok})
	}
	for _, params := range []string{`{"name":"log_me"}`, `{"name":"log_me","arguments":null}`, `{"name":"log_me","arguments":{}}`} {
		res, _ := h.ok(call(params), params)["result"].(map[string]any)
		if res["isError"] != false || !cmp.Equal(res["structuredContent"], map[string]any{"ok": true}) {
			t.Errorf("%s: %v", params, res)
		}
	}
	for _, params := range []string{`{"name":"log_me","arguments":[1]}`, `{"name":"log_me","arguments":"x"}`} {
		e, _ := h.ok(call(params), params)["error"].(map[string]any)
		if e["code"] != -32602.0 {
			t.Errorf("%s: error %v, want invalid params", params, e)
		}
	}
	h.want(call(`{"name":"unencodable"}`), 500, httpapi.CodeInternal, "a reply that cannot be encoded")
}
