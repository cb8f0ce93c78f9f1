package http

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	nethttp "net/http"
	"slices"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/participant"
	"github.com/sandboxowner/owner/resources"
)

// The MCP endpoint: the resources server's tools as Gym's MCP environments
// call them, JSON-RPC 2.0 over POST (MCP's streamable HTTP transport,
// answered as plain JSON), the session named by a signed token header
// instead of the cookie.
const (
	RouteMCP = "/mcp"
	// HeaderMCPSession carries the session token resources_tools hands out.
	HeaderMCPSession = "X-NeMo-Gym-Session-Token"
	// MCPProtocolVersion is the protocol version answered when the client
	// names none.
	MCPProtocolVersion = "2025-06-18"
	mcpTokenSalt       = "nemo-gym-mcp-session-token"
)

// ResourcesTools is Gym's resources_tools: where and how an environment
// reaches the session's tools.
type ResourcesTools struct {
	ServerName string            `json:"server_name"`
	URLPath    string            `json:"url_path"`
	Transport  string            `json:"transport"`
	Headers    map[string]string `json:"headers"`
}

// resourcesTools is the session's resources_tools, nil without tools.
func (s *Server) resourcesTools(sessionID string) *ResourcesTools {
	if len(s.tools) == 0 {
		return nil
	}
	return &ResourcesTools{ServerName: s.res.Name(), URLPath: RouteMCP, Transport: "http",
		Headers: map[string]string{HeaderMCPSession: s.mcpSigner.Sign(sessionID)}}
}

type rpcRequest struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params"`
}

type rpcError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// JSON-RPC's error codes.
const (
	rpcParseError     = -32700
	rpcInvalidRequest = -32600
	rpcMethodNotFound = -32601
	rpcInvalidParams  = -32602
)

func writeRPC(ctx *fasthttp.RequestCtx, status int, id json.RawMessage, result any, rerr *rpcError) {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	msg := map[string]any{"jsonrpc": "2.0", "id": id}
	if rerr != nil {
		msg["error"] = rerr
	} else {
		msg["result"] = result
	}
	writeJSON(ctx, status, msg)
}

func (s *Server) serveMCP(ctx *fasthttp.RequestCtx) {
	if !ctx.IsPost() {
		methodNotAllowed(ctx, "POST")
		return
	}
	var req rpcRequest
	if err := json.Unmarshal(ctx.PostBody(), &req); err != nil {
		writeRPC(ctx, nethttp.StatusBadRequest, nil, nil, &rpcError{rpcParseError, "parse error: " + err.Error()})
		return
	}
	if req.JSONRPC != "2.0" || req.Method == "" {
		writeRPC(ctx, nethttp.StatusBadRequest, req.ID, nil, &rpcError{rpcInvalidRequest, `want {"jsonrpc": "2.0", "method", ...}`})
		return
	}
	if len(req.ID) == 0 {
		// A notification (notifications/initialized …): accepted, no answer.
		ctx.SetStatusCode(nethttp.StatusAccepted)
		return
	}
	switch req.Method {
	case "initialize":
		var p struct {
			ProtocolVersion string `json:"protocolVersion"`
		}
		_ = json.Unmarshal(req.Params, &p)
		if p.ProtocolVersion == "" {
			p.ProtocolVersion = MCPProtocolVersion
		}
		writeRPC(ctx, nethttp.StatusOK, req.ID, map[string]any{
			"protocolVersion": p.ProtocolVersion,
			"capabilities":    map[string]any{"tools": map[string]any{"listChanged": false}},
			"serverInfo":      map[string]any{"name": s.res.Name(), "version": "1"},
		}, nil)
	case "ping":
		writeRPC(ctx, nethttp.StatusOK, req.ID, map[string]any{}, nil)
	case "tools/list":
		var tools []map[string]any
		for _, route := range slices.Sorted(maps.Keys(s.tools)) {
			tools = append(tools, map[string]any{
				"name":        strings.TrimPrefix(route, "/"),
				"description": "POST " + route + " of the " + s.res.Name() + " resources server",
				"inputSchema": map[string]any{"type": "object"},
			})
		}
		writeRPC(ctx, nethttp.StatusOK, req.ID, map[string]any{"tools": tools}, nil)
	case "tools/call":
		s.mcpCall(ctx, req)
	default:
		writeRPC(ctx, nethttp.StatusOK, req.ID, nil, &rpcError{rpcMethodNotFound, "no method " + req.Method})
	}
}

// mcpCall runs one tool call as the tool's route would run it: the token's
// session, admission through the checkpoint gate (a call waits while a
// checkpoint is open, a retired attempt's is refused), the tool. A tool's
// failure is a result with isError, its envelope as the text; a refusal of
// the session is the HTTP error it would be on the route.
func (s *Server) mcpCall(ctx *fasthttp.RequestCtx, req rpcRequest) {
	var p struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal(req.Params, &p); err != nil || p.Name == "" {
		writeRPC(ctx, nethttp.StatusOK, req.ID, nil, &rpcError{rpcInvalidParams, "tools/call needs params {name, arguments}"})
		return
	}
	tool, ok := s.tools["/"+p.Name]
	if !ok {
		writeRPC(ctx, nethttp.StatusOK, req.ID, nil, &rpcError{rpcInvalidParams, "no tool " + p.Name})
		return
	}
	sid, ok := s.mcpSigner.Verify(string(ctx.Request.Header.Peek(HeaderMCPSession)))
	if !ok {
		s.fail(ctx, control.ErrUnauthorized.With("a valid %s header is required", HeaderMCPSession))
		return
	}
	args := bytes.TrimSpace(p.Arguments)
	if len(args) == 0 || string(args) == "null" {
		args = []byte("{}")
	}
	if err := resources.CheckObject(args); err != nil {
		writeRPC(ctx, nethttp.StatusOK, req.ID, nil, &rpcError{rpcInvalidParams, "arguments must be a JSON object"})
		return
	}
	sess := &resources.Session{ID: sid, Owner: s.own}
	s.own.Touch(sid)
	if s.part != nil {
		sess.Episode, sess.HasEpisode = s.part.BoundEpisode(sid)
	}
	ctx.SetUserValue(sessionValue, sid)
	if sess.HasEpisode {
		ctx.SetUserValue(captureKeyValue, sess.Episode.CaptureKey())
	}
	sess.Log = s.requestLog(ctx)
	rctx := s.requestContext(ctx)
	defer rctx.Cancel()
	if s.part != nil {
		leave, err := s.part.Admit(rctx, participant.Tool, sess)
		if err != nil {
			s.fail(ctx, err)
			return
		}
		if leave != nil {
			defer leave()
		}
	}
	reply, err := tool(rctx, sess, bytes.Clone(args))
	if err != nil {
		status, code, detail := classify(err)
		if status >= 500 {
			s.requestLog(ctx).WithError(err).WithField("tool", p.Name).Error("MCP tool call failed")
		}
		text, _ := json.Marshal(map[string]any{"error": map[string]string{"code": code, "detail": detail}})
		writeRPC(ctx, nethttp.StatusOK, req.ID, map[string]any{"content": []any{map[string]any{"type": "text", "text": string(text)}}, "isError": true}, nil)
		return
	}
	text, err := json.Marshal(reply)
	if err != nil {
		s.fail(ctx, errors.New("encode the tool's reply: "+err.Error()))
		return
	}
	writeRPC(ctx, nethttp.StatusOK, req.ID, map[string]any{
		"content":           []any{map[string]any{"type": "text", "text": string(text)}},
		"structuredContent": json.RawMessage(text),
		"isError":           false,
	}, nil)
}
