package opensandboxtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxowner/owner/provider"
)

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	req, ok := s.readChecked(w, r, createSandboxSchema, false)
	if !ok {
		return
	}
	var p problems
	_, hasImage := req["image"]
	_, hasSnap := req["snapshotId"]
	_, hasPool := stringMap(req["extensions"])["poolRef"]
	switch {
	case hasImage == hasSnap:
		p.refuse("exactly one of image and snapshotId is required")
	case hasImage && req["entrypoint"] == nil:
		p.refuse("entrypoint is required with image")
	}
	if _, ok := req["resourceLimits"]; !ok && !hasPool {
		p.refuse("resourceLimits is required")
	}
	s.note(r, p.refused...)
	if len(p.refused) > 0 {
		writeInvalid(w, p.refused...)
		return
	}
	if md, ok := req["metadata"].(map[string]any); ok {
		var lp problems
		checkLabels(md, &lp)
		s.note(r, lp.refused...)
		if len(lp.refused) > 0 {
			writeError(w, http.StatusBadRequest, "SANDBOX::INVALID_METADATA_LABEL", "%s", strings.Join(lp.refused, "; "))
			return
		}
	}
	now := s.clk.Now()
	sb := &sandbox{
		createdAt: now,
		readyAt:   now.Add(s.opts.CreateLatency),
		metadata:  stringMap(req["metadata"]),
		env:       stringMap(req["env"]),
	}
	if ep, ok := req["entrypoint"].([]any); ok {
		for _, e := range ep {
			sb.entrypoint = append(sb.entrypoint, e.(string))
		}
	} else {
		sb.entrypoint = []string{"tail", "-f", "/dev/null"}
	}
	if n, ok := req["timeout"].(json.Number); ok {
		secs, _ := n.Int64()
		sb.expiresAt = now.Add(time.Duration(secs) * time.Second)
	}
	// An entrypoint that exits ends the sandbox: 0 Terminated, else Failed.
	switch {
	case len(sb.entrypoint) == 1 && sb.entrypoint[0] == "true":
		sb.exited = "Terminated"
	case len(sb.entrypoint) == 1 && sb.entrypoint[0] == "false":
		sb.exited = "Failed"
	}
	var sn *snapshot
	if hasSnap {
		sb.snapshotID = req["snapshotId"].(string)
		s.mu.Lock()
		var st string
		var ok bool
		if sn, ok = s.snapshots[sb.snapshotID]; ok {
			st = s.snapshotState(sn, now)
			// A fork inherits its source's labels and environment; what
			// the request names wins.
			md, env := maps.Clone(sn.metadata), maps.Clone(sn.env)
			maps.Copy(md, sb.metadata)
			maps.Copy(env, sb.env)
			sb.metadata, sb.env = md, env
		}
		s.mu.Unlock()
		switch {
		case !ok:
			writeError(w, http.StatusNotFound, "SNAPSHOT::NOT_FOUND", "snapshot %s not found", sb.snapshotID)
			return
		case !strings.EqualFold(st, "Ready"):
			writeError(w, http.StatusConflict, "SNAPSHOT::NOT_READY", "snapshot %s is %s", sb.snapshotID, st)
			return
		}
	}
	// The backend is the runtime: it keeps the labels and the lease too,
	// as Docker keeps a container's labels.
	spec := provider.Spec{Workdir: "/", Env: sb.env, Metadata: sb.metadata}
	if !sb.expiresAt.IsZero() {
		spec.TTLSeconds = sb.expiresAt.Sub(now).Seconds()
	}
	var err error
	if hasImage {
		sb.image, _ = req["image"].(map[string]any)["uri"].(string)
		spec.Image = sb.image
		sb.backend, err = s.backend.Start(r.Context(), spec)
	} else {
		sb.backend, err = s.backend.Fork(r.Context(), spec, sn.backendID)
	}
	if err != nil {
		s.backendError(w, "SANDBOX::PROVISION_FAILED", err)
		return
	}
	sb.id = sb.backend.SandboxID
	s.mu.Lock()
	// Counted at the clock's time now, not the request's start: a sandbox
	// a client saw running while this request was on its way is not
	// starting any more.
	starting, at := 1, s.clk.Now()
	for _, o := range s.sandboxes {
		if at.Before(o.readyAt) {
			starting++
		}
	}
	s.stats.PeakStarting = max(s.stats.PeakStarting, starting)
	s.seq++
	sb.seq = s.seq
	if s.failCreate > 0 {
		s.failCreate--
		sb.failed = true
	}
	s.sandboxes[sb.id] = sb
	s.stats.Created++
	if hasSnap {
		s.stats.Restored++
	}
	body := s.sandboxJSON(sb, now, true)
	s.mu.Unlock()
	if sb.exited != "" {
		_ = s.backend.Stop(context.Background(), sb.backend)
	}
	// No Location: the real server sends none for a sandbox.
	writeJSON(w, http.StatusAccepted, body)
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	sb, ok := s.lookup(w, r)
	if !ok {
		return
	}
	s.mu.Lock()
	body := s.sandboxJSON(sb, s.clk.Now(), false)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, body)
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	sb, ok := s.lookup(w, r)
	if !ok {
		return
	}
	if err := s.backend.Stop(r.Context(), sb.backend); err != nil && !errors.Is(err, provider.ErrSandboxNotFound) {
		s.backendError(w, "SANDBOX::DELETE_FAILED", err)
		return
	}
	s.mu.Lock()
	if _, ok := s.sandboxes[sb.id]; ok {
		delete(s.sandboxes, sb.id)
		s.stats.Deleted++
	}
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) renew(w http.ResponseWriter, r *http.Request) {
	req, ok := s.readChecked(w, r, renewSchema, false)
	if !ok {
		return
	}
	t, err := time.Parse(time.RFC3339Nano, req["expiresAt"].(string))
	if err != nil {
		s.note(r, fmt.Sprintf("expiresAt %q is not RFC 3339", req["expiresAt"]))
		writeError(w, http.StatusBadRequest, "SANDBOX::INVALID_PARAMETER", "expiresAt: %v", err)
		return
	}
	sb, ok := s.lookup(w, r)
	if !ok {
		return
	}
	now := s.clk.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case sb.expiresAt.IsZero():
		writeError(w, http.StatusConflict, "DOCKER::INVALID_EXPIRATION", "sandbox %s has no expiration (manual cleanup)", sb.id)
	case !t.After(now):
		writeError(w, http.StatusBadRequest, "SANDBOX::INVALID_EXPIRATION", "expiresAt %s is not in the future", formatTime(t))
	default:
		// An ended sandbox is renewed too, as the real server renews an
		// exited container (its runtime's sandbox, the backend's here, is
		// gone: nothing to move there).
		if l := s.backend.Capabilities().Leaser; l != nil && sb.exited == "" {
			if err := l.Renew(r.Context(), sb.backend, t); err != nil {
				s.backendError(w, "SANDBOX::RENEW_FAILED", err)
				return
			}
		}
		sb.expiresAt = t
		// The renew answer has whole seconds, unlike the sandbox's.
		writeJSON(w, http.StatusOK, map[string]string{"expiresAt": t.UTC().Truncate(time.Second).Format(time.RFC3339)})
	}
}

func (s *Server) endpoint(w http.ResponseWriter, r *http.Request) {
	// As the real server: a port that is no integer, or a use_server_proxy
	// that is no boolean, fails the framework's validation (422); a port out
	// of range is the runtime's 400.
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil {
		s.note(r, "port is not an integer")
		writeInvalid(w, "port: Input should be a valid integer")
		return
	}
	if port < 1 || port > 65535 {
		s.note(r, "port is not 1-65535")
		writeError(w, http.StatusBadRequest, "DOCKER::INVALID_PORT", "Port must be between 1 and 65535.")
		return
	}
	proxy := false
	if v := r.URL.Query().Get("use_server_proxy"); v != "" {
		if proxy, err = strconv.ParseBool(v); err != nil {
			s.note(r, "use_server_proxy is not a boolean")
			writeInvalid(w, "use_server_proxy: Input should be a valid boolean")
			return
		}
	}
	sb, ok := s.lookup(w, r)
	if !ok {
		return
	}
	// The Docker runtime's execd has no access token: the answer names no
	// headers, and the proxy path has no /v1.
	ep := fmt.Sprintf("%s/direct/%s/proxy/%d", s.Domain, s.endpointKey(sb.id), port)
	if proxy {
		ep = fmt.Sprintf("%s/sandboxes/%s/proxy/%d", s.Domain, sb.id, port)
	}
	if len(s.opts.ExecdHeaders) > 0 {
		writeJSON(w, http.StatusOK, map[string]any{"endpoint": ep, "headers": s.opts.ExecdHeaders})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"endpoint": ep})
}

// listSandboxes pages through the sandboxes, the newest first, filtered by
// state and by metadata (a URL-encoded query string of labels, all of which
// must match), as the real server does.
func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	page, size, ok := s.paging(w, r)
	if !ok {
		return
	}
	filter := states(r.URL.Query())
	var want url.Values
	if md := r.URL.Query().Get("metadata"); md != "" {
		var err error
		if want, err = url.ParseQuery(md); err != nil {
			writeError(w, http.StatusBadRequest, "INVALID_METADATA_FORMAT", "Invalid metadata format: %v", err)
			return
		}
	}
	s.sync(r.Context())
	now := s.clk.Now()
	s.mu.Lock()
	var items []map[string]any
	for _, id := range newestFirst(idsBySeq(s.sandboxes, func(sb *sandbox) int { return sb.seq })) {
		sb := s.sandboxes[id]
		if matchState(filter, s.sandboxState(sb, now)) && matchLabels(sb.metadata, want) {
			items = append(items, s.sandboxJSON(sb, now, false))
		}
	}
	s.mu.Unlock()
	writePage(w, items, page, size)
}

// pause answers 202 with an empty body. The Docker runtime fails a second
// pause with 500, and a resume of a sandbox not paused with 409.
func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	sb, ok := s.lookup(w, r)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.sandboxState(sb, s.clk.Now())
	if !strings.EqualFold(st, "Running") {
		writeError(w, http.StatusInternalServerError, "DOCKER::SANDBOX_PAUSE_FAILED", "sandbox %s is %s", sb.id, st)
		return
	}
	sb.paused = true
	w.WriteHeader(http.StatusAccepted)
}

func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	sb, ok := s.lookup(w, r)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !sb.paused {
		writeError(w, http.StatusConflict, "DOCKER::SANDBOX_NOT_PAUSED", "sandbox %s is not paused", sb.id)
		return
	}
	sb.paused = false
	w.WriteHeader(http.StatusAccepted)
}

// patchMetadata applies a JSON merge patch to the labels: null removes one.
// It answers the whole sandbox.
func (s *Server) patchMetadata(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	var patch map[string]any
	if err == nil {
		err = json.Unmarshal(body, &patch)
	}
	if err != nil {
		writeInvalid(w, fmt.Sprintf("body is not a JSON object: %v", err))
		return
	}
	var p problems
	adds := map[string]any{}
	for k, v := range patch {
		switch v := v.(type) {
		case nil:
			if strings.HasPrefix(k, "opensandbox.io/") {
				p.refuse("metadata key %q is reserved", k)
			}
		case string:
			adds[k] = v
		default:
			p.refuse("metadata %s: want a string or null", k)
		}
	}
	checkLabels(adds, &p)
	s.note(r, p.refused...)
	if len(p.refused) > 0 {
		writeError(w, http.StatusBadRequest, "SANDBOX::INVALID_METADATA_LABEL", "%s", strings.Join(p.refused, "; "))
		return
	}
	sb, ok := s.lookup(w, r)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	md := maps.Clone(sb.metadata)
	if md == nil {
		md = map[string]string{}
	}
	for k, v := range patch {
		if v == nil {
			delete(md, k)
		} else {
			md[k] = v.(string)
		}
	}
	sb.metadata = md
	writeJSON(w, http.StatusOK, s.sandboxJSON(sb, s.clk.Now(), false))
}
