package opensandboxtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxowner/owner/provider"
)

// execdTokenEnv is the variable execd reads its access token from.
const execdTokenEnv = "EXECD_ACCESS_TOKEN"

// execd serves one sandbox's execd (reached through an endpoint).
func (s *Server) execd(w http.ResponseWriter, r *http.Request) {
	if r.PathValue("port") != strconv.Itoa(ExecdPort) {
		writeError(w, http.StatusNotFound, "SANDBOX::NOT_FOUND", "nothing listens on port %s", r.PathValue("port"))
		return
	}
	for k, v := range s.opts.ExecdHeaders {
		if r.Header.Get(k) != v {
			unauthorized(w, k)
			return
		}
	}
	id := r.PathValue("id")
	if key := r.PathValue("key"); key != "" {
		// A direct endpoint: whoever has its port now.
		s.mu.Lock()
		id = key
		if at, moved := s.ports[key]; moved {
			id = at
		}
		s.mu.Unlock()
		if id == "" {
			// A host port nobody has: no answer.
			s.fault(w, r, &Fault{Drop: true}, nil)
			return
		}
	}
	sb, ok := s.lookupID(w, r, id)
	if !ok {
		return
	}
	s.mu.Lock()
	running := s.running(sb, s.clk.Now())
	s.mu.Unlock()
	if !running {
		// execd is not up yet (or the sandbox failed): the proxy cannot
		// reach it.
		writeError(w, http.StatusBadGateway, "SANDBOX::UNREACHABLE", "execd of sandbox %s is not reachable", sb.id)
		return
	}
	// As execd started with EXECD_ACCESS_TOKEN: every route wants it,
	// /ping included. A runtime that names execd's token header itself
	// gave it its own token (by flag, which wins over the variable).
	if tok := sb.env[execdTokenEnv]; tok != "" && !s.runtimeToken() && r.Header.Get(ExecdTokenHeader) != tok {
		unauthorized(w, ExecdTokenHeader)
		return
	}
	op := r.Method + " " + r.PathValue("path")
	if id, ok := strings.CutPrefix(op, "GET command/status/"); ok {
		s.commandStatus(w, id)
		return
	}
	switch op {
	case "GET ping":
		w.WriteHeader(http.StatusOK)
	case "POST command":
		s.command(w, r, sb)
	case "DELETE command":
		s.interrupt(w, r)
	case "POST files/upload":
		s.upload(w, r, sb)
	case "GET files/download":
		s.download(w, r, sb)
	case "GET files/info":
		s.fileInfo(w, r, sb)
	default:
		s.note(r, "execd route not implemented by the fake: "+op)
		writeError(w, http.StatusNotFound, "NOT_FOUND", "no execd route %s", op)
	}
}

// runtimeToken reports whether Options.ExecdHeaders name execd's token.
func (s *Server) runtimeToken() bool {
	for k := range s.opts.ExecdHeaders {
		if http.CanonicalHeaderKey(k) == http.CanonicalHeaderKey(ExecdTokenHeader) {
			return true
		}
	}
	return false
}

// unauthorized is execd's refusal of a call without its token: 401, and
// its own error shape.
func unauthorized(w http.ResponseWriter, header string) {
	writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "Unauthorized: invalid or missing header " + header})
}

// ExecdToken is the access token sandbox id's execd was created with (its
// env's EXECD_ACCESS_TOKEN), "" for none or no such sandbox.
func (s *Server) ExecdToken(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb, ok := s.sandboxes[id]; ok {
		return sb.env[execdTokenEnv]
	}
	return ""
}

// endpointKey is the key of sandbox id's direct endpoint.
func (s *Server) endpointKey(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k, ok := s.keys[id]; ok {
		return k
	}
	return id
}

// Reassign makes sandbox to's execd answer at sandbox from's direct
// endpoint, as a runtime that restarts may give one container's host port
// to another: from gets an endpoint of its own again, and to's former one
// leads nowhere (the connection is closed without an answer).
func (s *Server) Reassign(from, to string) {
	fromKey, toKey := s.endpointKey(from), s.endpointKey(to)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ports[fromKey] = to
	s.keys[to] = fromKey
	if toKey != fromKey {
		s.ports[toKey] = ""
	}
	fresh := fmt.Sprintf("%s.%d", from, len(s.ports))
	s.ports[fresh] = from
	s.keys[from] = fresh
}

// frame is one event of the command stream.
type frame struct {
	Type          string      `json:"type"`
	Text          string      `json:"text,omitempty"`
	Timestamp     int64       `json:"timestamp"`
	ExecutionTime int64       `json:"execution_time,omitempty"`
	Error         *frameError `json:"error,omitempty"`
}

type frameError struct {
	EName     string   `json:"ename"`
	EValue    string   `json:"evalue"`
	Traceback []string `json:"traceback"`
}

// lines splits output into execd's events: one per line, without its
// ending; "\n", "\r" and "\r\n" each end a line, an empty line is the text
// "\n", and a last line without an ending is sent as it is.
func lines(s string) []string {
	var out []string
	cr := false
	start := 0
	for i := 0; i < len(s); i++ {
		b := s[i]
		if b != '\n' && b != '\r' {
			cr = false
			continue
		}
		switch {
		case i > start:
			out = append(out, s[start:i])
		case b == '\n' && cr:
			// the "\n" of "\r\n": its line was sent at the "\r"
		default:
			out = append(out, "\n")
		}
		cr = b == '\r'
		start = i + 1
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// command runs a command as the real execd's POST /command does. execd
// checks the cwd before it runs anything (400 when it is missing or not a
// directory) and then streams; the fake streams from the start when the
// backend shows the cwd is a directory, and otherwise (the in-memory backend
// has no directories) once the command has ended, so that a cwd the backend
// refuses is still a 400. As in the real execd, a caller that hangs up does
// not end the command: DELETE /command?id= does.
func (s *Server) command(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	req, ok := s.readChecked(w, r, runCommandSchema, false)
	if !ok {
		return
	}
	if _, gid := req["gid"]; gid {
		if _, uid := req["uid"]; !uid {
			s.note(r, "gid without uid")
			writeError(w, http.StatusBadRequest, "INVALID_REQUEST_BODY", "invalid request, validation error uid is required when gid is provided")
			return
		}
	}
	if bg, _ := req["background"].(bool); bg {
		s.note(r, "background commands are not implemented by the fake")
		writeError(w, http.StatusBadRequest, "INVALID_REQUEST_BODY", "background commands are not supported here")
		return
	}
	if req["command"].(string) == "" {
		writeError(w, http.StatusBadRequest, "INVALID_REQUEST_BODY", "invalid request, validation error Key: 'RunCommandRequest.Command' Error:Field validation for 'Command' failed on the 'required' tag")
		return
	}
	er := provider.ExecRequest{Command: req["command"].(string), Env: stringMap(req["envs"])}
	er.Cwd, _ = req["cwd"].(string)
	if n, ok := req["timeout"].(json.Number); ok {
		ms, _ := n.Int64()
		er.Timeout = time.Duration(ms) * time.Millisecond
	}
	if er.Cwd != "" {
		cwd, err := expandPath(er.Cwd, er.Env)
		if err != nil {
			writeError(w, http.StatusBadRequest, "INVALID_REQUEST_BODY", "invalid request, validation error cannot resolve working directory %q: %v", er.Cwd, err)
			return
		}
		er.Cwd = cwd
	}
	notDir := func() {
		writeError(w, http.StatusBadRequest, "INVALID_REQUEST_BODY", "invalid request, validation error working directory path is not a directory: %s", er.Cwd)
	}
	live := false
	if er.Cwd != "" {
		_, err := s.backend.ReadFile(r.Context(), sb.backend, er.Cwd)
		switch {
		case err == nil || errors.Is(err, syscall.ENOTDIR):
			notDir()
			return
		case !errors.Is(err, fs.ErrNotExist):
			live = true // it is there and not a file: a directory
		}
	}
	id := newID("cmd-")
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	start := s.clk.Now()
	defer s.commands.add(id, er.Command, start, cancel)()
	flusher, _ := w.(http.Flusher)
	// As execd, headers go with the first event, and a cut stream writes
	// nothing past its cut (see CutNextCommandStreams).
	keep, sent := s.nextCut(), 0
	send := func(f frame) {
		if keep >= 0 && sent >= keep {
			return
		}
		if sent == 0 {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
		}
		sent++
		f.Timestamp = s.clk.Now().UnixMilli()
		b, _ := json.Marshal(f)
		_, _ = w.Write(append(b, '\n', '\n'))
		if flusher != nil {
			flusher.Flush()
		}
	}
	begin := func() {
		send(frame{Type: "init", Text: id})
		send(frame{Type: "ping", Text: "pong"})
	}
	if live {
		begin()
	}
	res, err := s.backend.Exec(ctx, sb.backend, er)
	interrupted := ctx.Err() != nil
	if err != nil && !interrupted {
		// It did not start (or, for the in-memory backend, its cwd is
		// refused below): execd keeps no status of it.
		s.commands.forget(id)
	}
	if !live {
		switch {
		case err != nil && !interrupted && errors.Is(err, fs.ErrNotExist):
			writeError(w, http.StatusBadRequest, "INVALID_REQUEST_BODY", "invalid request, validation error working directory does not exist: %s: %v", er.Cwd, err)
			return
		case err != nil && !interrupted && errors.Is(err, syscall.ENOTDIR):
			notDir()
			return
		}
		begin()
	}
	if err != nil && !interrupted {
		send(frame{Type: "error", Error: &frameError{EName: "CommandExecError", EValue: err.Error(), Traceback: []string{err.Error()}}})
		return
	}
	// execd records how the command ended before its final event.
	switch {
	case interrupted:
		s.commands.finish(id, -1, "signal: terminated", s.clk.Now())
	case res.TimedOut:
		s.commands.finish(id, -1, "signal: killed", s.clk.Now())
	case res.ExitCode != 0:
		s.commands.finish(id, res.ExitCode, fmt.Sprintf("exit status %d", res.ExitCode), s.clk.Now())
	default:
		s.commands.finish(id, 0, "", s.clk.Now())
	}
	for _, c := range lines(res.Stdout) {
		send(frame{Type: "stdout", Text: c})
	}
	for _, c := range lines(res.Stderr) {
		send(frame{Type: "stderr", Text: c})
	}
	elapsed := s.clk.Now().Sub(start).Milliseconds()
	switch {
	case interrupted:
		// execd interrupts with SIGTERM (SIGKILL a few seconds later).
		send(frame{Type: "error", Error: &frameError{EName: "CommandExecError", EValue: "-1", Traceback: []string{"signal: terminated"}}})
	case res.TimedOut:
		send(frame{Type: "error", Error: &frameError{EName: "CommandExecError", EValue: "-1", Traceback: []string{"signal: killed"}}})
	case res.ExitCode != 0:
		send(frame{Type: "error", Error: &frameError{EName: "CommandExecError", EValue: strconv.Itoa(res.ExitCode), Traceback: []string{fmt.Sprintf("exit status %d", res.ExitCode)}}})
	default:
		send(frame{Type: "execution_complete", ExecutionTime: elapsed})
	}
}

// interrupt is DELETE /command?id=: it ends a running command, or answers
// 500 as the real execd does for one that is not running.
func (s *Server) interrupt(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	if id == "" {
		writeError(w, http.StatusBadRequest, "MISSING_QUERY", "missing query parameter 'id'")
		return
	}
	if !s.commands.cancel(id) {
		writeError(w, http.StatusInternalServerError, "RUNTIME_ERROR", "error interruptting code context. no such session")
		return
	}
	w.WriteHeader(http.StatusOK)
}

// execdEnv is the environment the fake's execd expands paths with (the
// real one uses its own process's, which in a container is root's).
func execdEnv(name string) (string, bool) {
	switch name {
	case "HOME":
		return "/root", true
	case "PATH":
		return "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", true
	}
	return "", false
}

// expandPath expands $NAME, ${NAME} and $<special> in a path, as the real
// execd does in every path and cwd (an undefined name is an error; a cwd
// sees the command's envs too).
func expandPath(path string, envs map[string]string) (string, error) {
	var missing []string
	out := os.Expand(path, func(name string) string {
		if v, ok := envs[name]; ok {
			return v
		}
		v, ok := execdEnv(name)
		if !ok && isName(name) {
			missing = append(missing, name)
		}
		return v
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("path references undefined environment variables: %s", strings.Join(missing, ","))
	}
	return out, nil
}

// isName: execd refuses undefined names, and lets $1, $$ and the like
// expand to nothing.
func isName(s string) bool {
	for i, c := range s {
		if c != '_' && (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return s != ""
}

// commandStatus answers GET /command/status/{id} as execd does: 404 for a
// command it does not know (it never started), else its status.
func (s *Server) commandStatus(w http.ResponseWriter, id string) {
	st, ok := s.commands.status(id)
	if !ok {
		writeError(w, http.StatusNotFound, "INVALID_REQUEST_BODY", "command not found: %s", id)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// statusDoc is execd's command status.
type statusDoc struct {
	ID         string     `json:"id"`
	Content    string     `json:"content,omitempty"`
	Running    bool       `json:"running"`
	ExitCode   *int       `json:"exit_code,omitempty"`
	Error      string     `json:"error,omitempty"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
}

// runningCommands are the commands of every sandbox, by id: the running
// ones can be interrupted, and every one has a status (execd keeps them all).
type runningCommands struct {
	mu       sync.Mutex
	m        map[string]context.CancelFunc
	statuses map[string]*statusDoc
}

// add registers a running command; the func returned makes it not
// interruptible any more.
func (c *runningCommands) add(id, content string, at time.Time, cancel context.CancelFunc) func() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m, c.statuses = map[string]context.CancelFunc{}, map[string]*statusDoc{}
	}
	c.m[id] = cancel
	c.statuses[id] = &statusDoc{ID: id, Content: content, Running: true, StartedAt: at}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.m, id)
	}
}

// finish records how command id ended.
func (c *runningCommands) finish(id string, code int, msg string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.statuses[id]; ok {
		st.Running, st.ExitCode, st.Error, st.FinishedAt = false, &code, msg, &at
	}
}

// forget drops command id, which never started.
func (c *runningCommands) forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.statuses, id)
}

// status is a copy of command id's status.
func (c *runningCommands) status(id string) (statusDoc, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, ok := c.statuses[id]
	if !ok {
		return statusDoc{}, false
	}
	return *st, true
}

// cancel ends a running command; false when none has that id.
func (c *runningCommands) cancel(id string) bool {
	c.mu.Lock()
	cancel, ok := c.m[id]
	c.mu.Unlock()
	if ok {
		cancel()
	}
	return ok
}

// upload takes repeated multipart pairs: a metadata part (a file part
// holding FileMetadata JSON), then the file part.
func (s *Server) upload(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	mr, err := r.MultipartReader()
	if err != nil {
		s.note(r, "upload is not multipart/form-data: "+err.Error())
		writeError(w, http.StatusBadRequest, "INVALID_REQUEST", "%v", err)
		return
	}
	var metas []string
	var files [][]byte
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			s.note(r, "malformed multipart body: "+err.Error())
			writeError(w, http.StatusBadRequest, "INVALID_REQUEST", "%v", err)
			return
		}
		data, err := io.ReadAll(io.LimitReader(part, maxBody))
		if err != nil {
			writeError(w, http.StatusBadRequest, "INVALID_REQUEST", "%v", err)
			return
		}
		switch part.FormName() {
		case "metadata":
			if part.FileName() == "" {
				s.note(r, "metadata part is not a file part")
				writeError(w, http.StatusBadRequest, "INVALID_REQUEST", "metadata must be a file part")
				return
			}
			m, p := decodeChecked(data, fileMetadataSchema)
			s.note(r, p.noted...)
			s.note(r, p.refused...)
			path, _ := m["path"].(string)
			if len(p.refused) > 0 || path == "" {
				s.note(r, "metadata without a path")
				writeError(w, http.StatusBadRequest, "INVALID_REQUEST", "metadata needs a path")
				return
			}
			metas = append(metas, path)
		case "file":
			files = append(files, data)
		default:
			s.note(r, fmt.Sprintf("unknown multipart part %q", part.FormName()))
		}
	}
	if len(metas) != len(files) || len(metas) == 0 {
		s.note(r, fmt.Sprintf("%d metadata parts for %d file parts", len(metas), len(files)))
		writeError(w, http.StatusBadRequest, "INVALID_REQUEST", "metadata and file parts must pair up")
		return
	}
	for i, path := range metas {
		path, err := expandPath(path, nil)
		if err != nil {
			writeError(w, http.StatusInternalServerError, "RUNTIME_ERROR", "error resolving target path %s. %v", metas[i], err)
			return
		}
		if err := s.backend.WriteFile(r.Context(), sb.backend, path, files[i]); err != nil {
			s.backendError(w, "RUNTIME_ERROR", err)
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) download(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	path := r.URL.Query().Get("path")
	if path == "" {
		s.note(r, "download without path")
		writeError(w, http.StatusBadRequest, "INVALID_REQUEST", "path is required")
		return
	}
	path, err := expandPath(path, nil)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "RUNTIME_ERROR", "error resolving file path: %s. %v", r.URL.Query().Get("path"), err)
		return
	}
	data, err := s.backend.ReadFile(r.Context(), sb.backend, path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		writeError(w, http.StatusNotFound, "FILE_NOT_FOUND", "%s: no such file", path)
	case err != nil:
		s.backendError(w, "RUNTIME_ERROR", err)
	default:
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(data)
	}
}

// fileInfo answers GET /files/info?path=P as execd does, {P: {"type": ...}},
// with the type the backend's read tells: a directory or a file.
func (s *Server) fileInfo(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	path := r.URL.Query().Get("path")
	_, err := s.backend.ReadFile(r.Context(), sb.backend, path)
	typ := "file"
	switch {
	case errors.Is(err, syscall.EISDIR):
		typ = "directory"
	case errors.Is(err, fs.ErrNotExist):
		writeError(w, http.StatusNotFound, "FILE_NOT_FOUND", "%s: no such file", path)
		return
	case err != nil:
		s.backendError(w, "RUNTIME_ERROR", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{path: map[string]string{"type": typ}})
}
