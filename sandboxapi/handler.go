package sandboxapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/internal/envelope"
	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/problem"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
)

// Prefix is where the routes are mounted: /sandboxes/{sandbox_id}/...
const Prefix = "/sandboxes/"

// DefaultMaxBody bounds request bodies when Handler.MaxBody is zero.
const DefaultMaxBody = 4 << 20

// fileCallTimeout bounds one ReadFile or WriteFile.
const fileCallTimeout = time.Minute

// execGrace is added to a command's timeout to bound the whole Exec call.
const execGrace = 30 * time.Second

// Resolver tells what became of a sandbox id and, when it is live, its
// handle. The owner answers it from its sessions (and what it remembers of
// superseded and ended sandboxes); it must be safe for concurrent use.
type Resolver func(sandboxID string) (provider.Handle, sandbox.Fate)

// Handler serves the agent-facing sandbox routes:
//
//	POST /sandboxes/{sandbox_id}/exec   {"command", "cwd", "env", "timeout_ms"}
//	     → 200 {"stdout", "stderr", "exit_code", "truncated", "timed_out"?}
//	GET  /sandboxes/{sandbox_id}/files?path=P  → 200 the file's bytes
//	PUT  /sandboxes/{sandbox_id}/files?path=P  (body: the bytes)
//	     → 200 {"path", "size"}
//
// each with "Authorization: Bearer <token>" for that sandbox. Errors are
// {"error":{"code","detail"}}:
//
//	401 unauthorized     missing, forged, or another sandbox's token
//	401 token_expired    a genuine token past its expiry
//	410 superseded       a restore replaced the sandbox: ask /sandbox_access again
//	410 ended            the sandbox's session ended
//	404 sandbox_not_found, file_not_found, not_found (no such route)
//	405 method_not_allowed
//	400 path_escape (a climb out, or a symlink: file calls follow none),
//	    bad_request (no path parameter), name_too_long
//	413 body_too_large, file_too_large (a file over the provider's cap)
//	422 invalid_request  malformed JSON, wrong types, unknown fields, no command
//	422 is_a_directory, not_a_directory (a component is a file),
//	    not_a_file (a FIFO, device or socket), invalid_cwd
//	409 admission_closed, 503 shutting_down (waiting on a checkpoint)
//	500 provider_error, 504 timeout
//
// Mount it with Serve for every path under Prefix, or call ServeSandbox
// from a router that already split the path. Provider, Tokens and Resolve
// are required.
type Handler struct {
	Provider provider.Provider
	Tokens   *Tokens
	Resolve  Resolver
	// Logger receives one line per failed request (nil: none).
	Logger logrus.FieldLogger
	// LogFields, when set, gives the fields every log line of a request
	// carries besides the sandbox's (its request id, the session holding
	// the sandbox), so that a client's call can be found in the log.
	LogFields func(ctx *fasthttp.RequestCtx) logrus.Fields
	// MaxBody bounds request bodies (DefaultMaxBody when zero). The
	// fasthttp server's own MaxRequestBodySize must be at least this, and
	// its ErrorHandler should answer fasthttp.ErrBodyTooLarge with 413.
	MaxBody int
	// MaxTimeout caps timeout_ms: a longer one, or one that does not fit a
	// duration, is 422 (no cap but the provider's when zero).
	MaxTimeout time.Duration
	// Admit, when set, passes an exec or a file write through the server's
	// admission gate before it runs: it waits while a checkpoint is open
	// and counts the call in flight until leave is called, so that a
	// checkpoint never cuts a command or a write in half. File reads are
	// not admitted. An error is answered with its status when it is a
	// *problem.Error, 503 otherwise.
	Admit func(ctx context.Context, sandboxID string) (leave func(), err error)
}

// SplitPath splits "/sandboxes/{sandbox_id}/{rest}" into its sandbox id and
// rest ("exec", "files"); ok is false for any other path.
func SplitPath(path string) (sandboxID, rest string, ok bool) {
	tail, found := strings.CutPrefix(path, Prefix)
	if !found {
		return "", "", false
	}
	sandboxID, rest, found = strings.Cut(tail, "/")
	if !found || sandboxID == "" || rest == "" {
		return "", "", false
	}
	return sandboxID, rest, true
}

// Route labels of the sandbox API's requests, for metrics and access
// logs: the sandbox id is left out so that labels stay bounded.
const (
	RouteExec  = Prefix + "{id}/exec"
	RouteFiles = Prefix + "{id}/files"
)

// RouteOf is path's route label: RouteExec, RouteFiles, or Prefix for
// any other path under it.
func RouteOf(path string) string {
	switch _, rest, _ := SplitPath(path); rest {
	case "exec":
		return RouteExec
	case "files":
		return RouteFiles
	}
	return Prefix
}

// Serve handles any request whose path is under Prefix.
func (h *Handler) Serve(ctx *fasthttp.RequestCtx) {
	id, rest, ok := SplitPath(string(ctx.Path()))
	if !ok {
		h.fail(ctx, "", fasthttp.StatusNotFound, "not_found", "no such route")
		return
	}
	h.ServeSandbox(ctx, id, rest)
}

// ServeSandbox handles the route rest ("exec" or "files") of sandbox
// sandboxID: it checks the method, the token, and the sandbox's fate, then
// runs the call on the provider.
func (h *Handler) ServeSandbox(ctx *fasthttp.RequestCtx, sandboxID, rest string) {
	if h.Provider == nil || h.Tokens == nil || h.Resolve == nil {
		h.writeError(ctx, fasthttp.StatusInternalServerError, "internal", "the sandbox routes are not configured")
		return
	}
	var allow []string
	switch rest {
	case "exec":
		allow = []string{fasthttp.MethodPost}
	case "files":
		allow = []string{fasthttp.MethodGet, fasthttp.MethodPut}
	default:
		h.fail(ctx, sandboxID, fasthttp.StatusNotFound, "not_found", "no such route")
		return
	}
	method := string(ctx.Method())
	if !slices.Contains(allow, method) {
		ctx.Response.Header.Set("Allow", strings.Join(allow, ", "))
		h.fail(ctx, sandboxID, fasthttp.StatusMethodNotAllowed, "method_not_allowed", method+" is not allowed here")
		return
	}
	if err := h.authorize(ctx, sandboxID); err != nil {
		code := "unauthorized"
		if errors.Is(err, ErrTokenExpired) {
			code = "token_expired"
		}
		ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="sandbox"`)
		h.fail(ctx, sandboxID, fasthttp.StatusUnauthorized, code, err.Error())
		return
	}
	handle, fate := h.Resolve(sandboxID)
	switch fate {
	case sandbox.FateLive:
	case sandbox.FateSuperseded:
		h.fail(ctx, sandboxID, fasthttp.StatusGone, "superseded", "a restore replaced this sandbox; ask /sandbox_access for the current one")
		return
	case sandbox.FateEnded:
		h.fail(ctx, sandboxID, fasthttp.StatusGone, "ended", "the session that held this sandbox has ended")
		return
	default:
		h.fail(ctx, sandboxID, fasthttp.StatusNotFound, "sandbox_not_found", "no such sandbox")
		return
	}
	if n := len(ctx.Request.Body()); n > h.maxBody() {
		h.fail(ctx, sandboxID, fasthttp.StatusRequestEntityTooLarge, "body_too_large", fmt.Sprintf("the body is %d bytes, more than %d", n, h.maxBody()))
		return
	}
	admit := h.Admit != nil && (rest == "exec" || method == fasthttp.MethodPut)
	callCtx := h.callContext(ctx)
	if admit || rest == "exec" {
		// The wait at the gate, and an exec, last while the client does
		// (a shutdown lets every waiter go): one watcher for both.
		var gone context.CancelFunc
		callCtx, gone = context.WithCancel(callCtx)
		defer gone()
		defer watchClient(ctx.Conn(), gone)()
	}
	if admit {
		leave, err := h.Admit(callCtx, sandboxID)
		if err != nil {
			status, code := fasthttp.StatusServiceUnavailable, "unavailable"
			var ce *problem.Error
			if errors.As(err, &ce) {
				status, code = ce.Status, ce.Code
			}
			h.fail(ctx, sandboxID, status, code, err.Error())
			return
		}
		defer leave()
	}
	switch {
	case rest == "exec":
		h.exec(ctx, callCtx, handle)
	case method == fasthttp.MethodGet:
		h.readFile(ctx, handle)
	default:
		h.writeFile(ctx, handle)
	}
}

func (h *Handler) maxBody() int {
	if h.MaxBody > 0 {
		return h.MaxBody
	}
	return DefaultMaxBody
}

func (h *Handler) authorize(ctx *fasthttp.RequestCtx, sandboxID string) error {
	auth := string(ctx.Request.Header.Peek(fasthttp.HeaderAuthorization))
	scheme, token, ok := strings.Cut(auth, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return fmt.Errorf("%w: missing bearer token", ErrTokenInvalid)
	}
	_, err := h.Tokens.Verify(strings.TrimSpace(token), sandboxID)
	return err
}

// execRequest is the exec route's body.
type execRequest struct {
	Command   *string           `json:"command"`
	Cwd       string            `json:"cwd"`
	Env       map[string]string `json:"env"`
	TimeoutMS int64             `json:"timeout_ms"`
}

// exec runs the request's command; callCtx ends when the client goes, and
// an agent that goes away does not leave its command running.
func (h *Handler) exec(ctx *fasthttp.RequestCtx, callCtx context.Context, handle provider.Handle) {
	var req execRequest
	if err := decodeStrict(ctx.Request.Body(), &req); err != nil {
		h.fail(ctx, handle.SandboxID, fasthttp.StatusUnprocessableEntity, "invalid_request", err.Error())
		return
	}
	switch {
	case req.Command == nil || *req.Command == "":
		h.fail(ctx, handle.SandboxID, fasthttp.StatusUnprocessableEntity, "invalid_request", `"command" is required`)
		return
	case req.TimeoutMS < 0:
		h.fail(ctx, handle.SandboxID, fasthttp.StatusUnprocessableEntity, "invalid_request", `"timeout_ms" must not be negative`)
		return
	case req.TimeoutMS > int64((math.MaxInt64-execGrace)/time.Millisecond) || h.MaxTimeout > 0 && time.Duration(req.TimeoutMS)*time.Millisecond > h.MaxTimeout:
		h.fail(ctx, handle.SandboxID, fasthttp.StatusUnprocessableEntity, "invalid_request", fmt.Sprintf(`"timeout_ms" %d is over the maximum %d`, req.TimeoutMS, h.MaxTimeout.Milliseconds()))
		return
	}
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	if timeout > 0 {
		var cancel context.CancelFunc
		callCtx, cancel = context.WithTimeout(callCtx, timeout+execGrace)
		defer cancel()
	}
	res, err := h.Provider.Exec(callCtx, handle, provider.ExecRequest{Command: *req.Command, Cwd: req.Cwd, Env: req.Env, Timeout: timeout})
	if err != nil {
		h.providerError(ctx, handle.SandboxID, err, "invalid_cwd")
		return
	}
	h.reply(ctx, res)
}

func (h *Handler) readFile(ctx *fasthttp.RequestCtx, handle provider.Handle) {
	path, ok := h.pathArg(ctx, handle.SandboxID)
	if !ok {
		return
	}
	callCtx, cancel := context.WithTimeout(h.callContext(ctx), fileCallTimeout)
	defer cancel()
	if o := h.Provider.Capabilities().FileOpener; o != nil {
		// Streamed: the server holds a buffer of the file at a time, not
		// the file, however many are read at once.
		rc, size, err := o.OpenFile(callCtx, handle, path)
		if err != nil {
			h.providerError(ctx, handle.SandboxID, err, "file_not_found")
			return
		}
		ctx.SetStatusCode(fasthttp.StatusOK)
		ctx.SetContentType("application/octet-stream")
		ctx.SetBodyStream(rc, int(size)) // fasthttp closes rc once sent
		return
	}
	b, err := h.Provider.ReadFile(callCtx, handle, path)
	if err != nil {
		h.providerError(ctx, handle.SandboxID, err, "file_not_found")
		return
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("application/octet-stream")
	ctx.SetBody(b)
}

func (h *Handler) writeFile(ctx *fasthttp.RequestCtx, handle provider.Handle) {
	path, ok := h.pathArg(ctx, handle.SandboxID)
	if !ok {
		return
	}
	data := bytes.Clone(ctx.Request.Body())
	callCtx, cancel := context.WithTimeout(h.callContext(ctx), fileCallTimeout)
	defer cancel()
	if err := h.Provider.WriteFile(callCtx, handle, path, data); err != nil {
		h.providerError(ctx, handle.SandboxID, err, "file_not_found")
		return
	}
	h.reply(ctx, map[string]any{"path": path, "size": len(data)})
}

func (h *Handler) pathArg(ctx *fasthttp.RequestCtx, sandboxID string) (string, bool) {
	path := string(ctx.QueryArgs().Peek("path"))
	if path == "" {
		h.fail(ctx, sandboxID, fasthttp.StatusBadRequest, "bad_request", `the query parameter "path" is required`)
		return "", false
	}
	return path, true
}

// unavailableRetryAfter is the Retry-After (seconds) of a 503
// provider_unavailable, as the resources server's.
const unavailableRetryAfter = "5"

// providerError maps a provider error to a status; notExistCode names a
// missing path (a file, or an exec's cwd).
func (h *Handler) providerError(ctx *fasthttp.RequestCtx, sandboxID string, err error, notExistCode string) {
	status, code, detail := fasthttp.StatusInternalServerError, "provider_error", "the sandbox provider failed"
	switch {
	case errors.Is(err, provider.ErrPathEscape):
		status, code, detail = fasthttp.StatusBadRequest, "path_escape", "the path leaves the sandbox"
	case errors.Is(err, provider.ErrSandboxNotFound):
		status, code, detail = fasthttp.StatusNotFound, "sandbox_not_found", "the sandbox is gone"
	case errors.Is(err, provider.ErrOutcomeLost):
		// Made, or maybe made, and its outcome lost (an execd stream cut
		// before its final event): retryable as any 503, but the agent is
		// told that a retry may run its command twice.
		status, code, detail = fasthttp.StatusServiceUnavailable, "provider_unavailable", "the command was sent and may have run, but its outcome was lost; a retry runs it again"
		ctx.Response.Header.Set("Retry-After", unavailableRetryAfter)
	case errors.Is(err, provider.ErrUnavailable):
		// Not made, and worth making again: the provider's backend gave no
		// answer (an OpenSandbox lifecycle server asked whether the sandbox
		// has ended before a connection to its execd).
		status, code, detail = fasthttp.StatusServiceUnavailable, "provider_unavailable", "the sandbox provider's backend did not answer; retry"
		ctx.Response.Header.Set("Retry-After", unavailableRetryAfter)
	case errors.Is(err, fs.ErrNotExist):
		status, code, detail = fasthttp.StatusNotFound, notExistCode, "no such file or directory"
		if notExistCode == "invalid_cwd" {
			status = fasthttp.StatusUnprocessableEntity
		}
	case notExistCode == "invalid_cwd" && (errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.ENAMETOOLONG)):
		status, code, detail = fasthttp.StatusUnprocessableEntity, "invalid_cwd", "cwd is not a directory"
	case errors.Is(err, syscall.EISDIR):
		status, code, detail = fasthttp.StatusUnprocessableEntity, "is_a_directory", "the path is a directory"
	case errors.Is(err, syscall.ENOTDIR):
		status, code, detail = fasthttp.StatusUnprocessableEntity, "not_a_directory", "a component of the path is not a directory"
	case errors.Is(err, syscall.ENAMETOOLONG):
		status, code, detail = fasthttp.StatusBadRequest, "name_too_long", "a name in the path is too long"
	case errors.Is(err, provider.ErrFileTooLarge):
		status, code, detail = fasthttp.StatusRequestEntityTooLarge, "file_too_large", "the file is larger than the server's cap on one file"
	case errors.Is(err, provider.ErrNotRegular):
		status, code, detail = fasthttp.StatusUnprocessableEntity, "not_a_file", "the path is a FIFO, device or socket, not a regular file"
	case errors.Is(err, provider.ErrInvalidSpec):
		status, code, detail = fasthttp.StatusUnprocessableEntity, "invalid_request", err.Error()
	case errors.Is(err, provider.ErrUnsupported):
		status, code, detail = fasthttp.StatusNotImplemented, "unsupported", "the sandbox provider cannot do this"
	case errors.Is(err, context.DeadlineExceeded):
		status, code, detail = fasthttp.StatusGatewayTimeout, "timeout", "the sandbox call took too long"
	}
	if h.Logger != nil {
		h.log(ctx).WithError(err).WithFields(logrus.Fields{"sandbox_id": sandboxID, "status": status, "code": code}).Info("sandboxapi: provider call failed")
	}
	h.writeError(ctx, status, code, detail)
}

func (h *Handler) fail(ctx *fasthttp.RequestCtx, sandboxID string, status int, code, detail string) {
	if h.Logger != nil {
		h.log(ctx).WithFields(logrus.Fields{"sandbox_id": sandboxID, "status": status, "code": code, "path": string(ctx.Path())}).Debug("sandboxapi: refused")
	}
	h.writeError(ctx, status, code, detail)
}

// callContext is the base of a request's provider calls: it carries the
// request's id (from LogFields), so that the provider's log lines name it.
func (h *Handler) callContext(ctx *fasthttp.RequestCtx) context.Context {
	base := context.Background()
	if h.LogFields == nil {
		return base
	}
	id, _ := h.LogFields(ctx)[logs.RequestID].(string)
	return logs.WithRequestID(base, id)
}

// log is Logger with the request's LogFields.
func (h *Handler) log(ctx *fasthttp.RequestCtx) logrus.FieldLogger {
	if h.LogFields == nil {
		return h.Logger
	}
	return h.Logger.WithFields(h.LogFields(ctx))
}

func (h *Handler) writeError(ctx *fasthttp.RequestCtx, status int, code, detail string) {
	envelope.WriteError(ctx, status, code, detail)
}

func (h *Handler) reply(ctx *fasthttp.RequestCtx, v any) { h.writeJSON(ctx, fasthttp.StatusOK, v) }

func (h *Handler) writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	envelope.WriteJSON(ctx, status, v)
}

// decodeStrict decodes exactly one JSON object, refusing unknown fields and
// trailing data.
func decodeStrict(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return errors.New("the body must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("malformed body: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("malformed body: data after the JSON object")
	}
	return nil
}
