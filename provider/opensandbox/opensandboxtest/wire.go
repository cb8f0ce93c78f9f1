package opensandboxtest

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/sandboxowner/owner/provider"
)

func newID(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// apiError is the lifecycle API's error body.
type apiError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, code, format string, args ...any) {
	writeJSON(w, status, apiError{Code: code, Message: fmt.Sprintf(format, args...)})
}

// writeInvalid answers a request that fails validation as the real server's
// framework (FastAPI) does: 422 {"detail": [{"loc", "msg", "type"}, ...]}.
func writeInvalid(w http.ResponseWriter, msgs ...string) {
	detail := make([]map[string]any, 0, len(msgs))
	for _, m := range msgs {
		detail = append(detail, map[string]any{"loc": []string{"body"}, "msg": m, "type": "value_error"})
	}
	writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"detail": detail})
}

// codeSandboxNotFound is the Docker runtime's 404 for a sandbox.
const codeSandboxNotFound = "DOCKER::SANDBOX_NOT_FOUND"

// note records a departure from the spec.
func (s *Server) note(r *http.Request, msgs ...string) {
	if len(msgs) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		s.violations = append(s.violations, r.Method+" "+r.URL.Path+": "+m)
	}
}

// readChecked reads a JSON body and checks it against sc; on a refusal it
// answers 400 and returns false.
func (s *Server) readChecked(w http.ResponseWriter, r *http.Request, sc *schema, optional bool) (map[string]any, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusBadRequest, "SANDBOX::INVALID_PARAMETER", "read body: %v", err)
		return nil, false
	}
	if optional && len(body) == 0 {
		return map[string]any{}, true
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		s.note(r, fmt.Sprintf("Content-Type %q, want application/json", ct))
	}
	m, p := decodeChecked(body, sc)
	s.note(r, p.noted...)
	s.note(r, p.refused...)
	if len(p.refused) > 0 {
		writeInvalid(w, p.refused...)
		return nil, false
	}
	return m, true
}

// sandboxJSON is the Sandbox schema (CreateSandboxResponse when create).
func (s *Server) sandboxJSON(sb *sandbox, now time.Time, create bool) map[string]any {
	m := map[string]any{
		"id": sb.id,
		"status": map[string]any{
			"state":            s.sandboxState(sb, now),
			"reason":           "provisioning",
			"lastTransitionAt": formatTime(sb.createdAt),
		},
		"metadata":   sb.metadata,
		"entrypoint": sb.entrypoint,
		"createdAt":  formatTime(sb.createdAt),
	}
	if !sb.expiresAt.IsZero() {
		m["expiresAt"] = formatTime(sb.expiresAt)
	}
	if !create {
		if sb.image != "" {
			m["image"] = map[string]any{"uri": sb.image}
		} else {
			m["snapshotId"] = sb.snapshotID
		}
	}
	return m
}

func (s *Server) snapshotJSON(sn *snapshot, now time.Time) map[string]any {
	m := map[string]any{
		"id":        sn.id,
		"sandboxId": sn.sandboxID,
		"status":    map[string]any{"state": s.snapshotState(sn, now), "lastTransitionAt": formatTime(sn.createdAt)},
		"createdAt": formatTime(sn.createdAt),
	}
	if sn.name != "" {
		m["name"] = sn.name
	}
	return m
}

func stringMap(v any) map[string]string {
	out := map[string]string{}
	m, _ := v.(map[string]any)
	for k, e := range m {
		out[k], _ = e.(string)
	}
	return out
}

// backendError answers a failed backend call: a missing sandbox or snapshot
// is 404, anything else 500.
func (s *Server) backendError(w http.ResponseWriter, code string, err error) {
	switch {
	case errors.Is(err, provider.ErrSandboxNotFound):
		writeError(w, http.StatusNotFound, codeSandboxNotFound, "%v", err)
	case errors.Is(err, provider.ErrSnapshotNotFound):
		writeError(w, http.StatusNotFound, "SNAPSHOT::NOT_FOUND", "%v", err)
	default:
		writeError(w, http.StatusInternalServerError, code, "%v", err)
	}
}

// lookup finds a live sandbox or answers 404. The backend is the runtime:
// a sandbox it no longer has is gone, and one it has that the server never
// recorded (a create whose answer failed after its effect) is listed, as a
// server listing its runtime's containers would.
func (s *Server) lookup(w http.ResponseWriter, r *http.Request) (*sandbox, bool) {
	return s.lookupID(w, r, r.PathValue("id"))
}

// lookupID is lookup of the sandbox id.
func (s *Server) lookupID(w http.ResponseWriter, r *http.Request, id string) (*sandbox, bool) {
	s.sync(r.Context())
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	s.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, codeSandboxNotFound, "sandbox %s not found", id)
	}
	return sb, ok
}
