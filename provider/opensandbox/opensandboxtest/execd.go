package opensandboxtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxowner/owner/provider"
)

// execdError is execd's error body for a refused token.
type execdError struct {
	Error string `json:"error"`
}

// execd serves one sandbox's execd (reached through an endpoint).
func (s *Server) execd(w http.ResponseWriter, r *http.Request) {
	if r.PathValue("port") != strconv.Itoa(ExecdPort) {
		writeError(w, http.StatusNotFound, "SANDBOX::NOT_FOUND", "nothing listens on port %s", r.PathValue("port"))
		return
	}
	sb, ok := s.lookup(w, r)
	if !ok {
		return
	}
	if r.Header.Get(ExecdTokenHeader) != sb.token {
		s.note(r, "execd call without the endpoint's headers")
		writeJSON(w, http.StatusUnauthorized, execdError{Error: "invalid or missing " + ExecdTokenHeader})
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
	switch op := r.Method + " " + r.PathValue("path"); op {
	case "GET ping":
		w.WriteHeader(http.StatusOK)
	case "POST command":
		s.command(w, r, sb)
	case "POST files/upload":
		s.upload(w, r, sb)
	case "GET files/download":
		s.download(w, r, sb)
	default:
		s.note(r, "execd route not implemented by the fake: "+op)
		writeError(w, http.StatusNotFound, "NOT_FOUND", "no execd route %s", op)
	}
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

// chunks splits s into line-sized pieces, as execd streams output.
func chunks(s string) []string {
	var out []string
	for s != "" {
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			return append(out, s)
		}
		out = append(out, s[:i+1])
		s = s[i+1:]
	}
	return out
}

func (s *Server) command(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	req, ok := s.readChecked(w, r, runCommandSchema, false)
	if !ok {
		return
	}
	if _, gid := req["gid"]; gid {
		if _, uid := req["uid"]; !uid {
			s.note(r, "gid without uid")
			writeError(w, http.StatusBadRequest, "INVALID_REQUEST", "gid requires uid")
			return
		}
	}
	if bg, _ := req["background"].(bool); bg {
		s.note(r, "background commands are not implemented by the fake")
		writeError(w, http.StatusBadRequest, "INVALID_REQUEST", "background commands are not supported here")
		return
	}
	er := provider.ExecRequest{Command: req["command"].(string), Env: stringMap(req["envs"])}
	er.Cwd, _ = req["cwd"].(string)
	if n, ok := req["timeout"].(json.Number); ok {
		ms, _ := n.Int64()
		er.Timeout = time.Duration(ms) * time.Millisecond
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	send := func(f frame) {
		f.Timestamp = s.clk.Now().UnixMilli()
		b, _ := json.Marshal(f)
		_, _ = w.Write(append(b, '\n', '\n'))
		if flusher != nil {
			flusher.Flush()
		}
	}
	start := s.clk.Now()
	send(frame{Type: "init", Text: newID("cmd-")})
	send(frame{Type: "ping", Text: "pong"})
	res, err := s.backend.Exec(r.Context(), sb.backend, er)
	if err != nil {
		send(frame{Type: "error", Error: &frameError{EName: "CommandExecError", EValue: err.Error(), Traceback: []string{}}})
		return
	}
	for _, c := range chunks(res.Stdout) {
		send(frame{Type: "stdout", Text: c})
	}
	for _, c := range chunks(res.Stderr) {
		send(frame{Type: "stderr", Text: c})
	}
	elapsed := s.clk.Now().Sub(start).Milliseconds()
	switch {
	case res.TimedOut:
		send(frame{Type: "error", ExecutionTime: elapsed, Error: &frameError{EName: "CommandExecError", EValue: "-1", Traceback: []string{"timeout"}}})
	case res.ExitCode != 0:
		send(frame{Type: "error", ExecutionTime: elapsed, Error: &frameError{EName: "CommandExecError", EValue: strconv.Itoa(res.ExitCode), Traceback: []string{}}})
	default:
		send(frame{Type: "execution_complete", ExecutionTime: elapsed})
	}
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
		if err := s.backend.WriteFile(r.Context(), sb.backend, path, files[i]); err != nil {
			s.backendError(w, "INTERNAL_ERROR", err)
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
	data, err := s.backend.ReadFile(r.Context(), sb.backend, path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		writeError(w, http.StatusNotFound, "FILE_NOT_FOUND", "%s: no such file", path)
	case err != nil:
		s.backendError(w, "INTERNAL_ERROR", err)
	default:
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(data)
	}
}
