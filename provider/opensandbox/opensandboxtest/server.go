package opensandboxtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
)

// ExecdPort is the port execd listens on inside a sandbox.
const ExecdPort = 44772

// APIKeyHeader authenticates the lifecycle API.
const APIKeyHeader = "OPEN-SANDBOX-API-KEY"

// ExecdTokenHeader is the header an execd started with an access token
// checks; the Docker runtime starts execd without one.
const ExecdTokenHeader = "X-EXECD-ACCESS-TOKEN"

// maxBody bounds a request body the fake reads.
const maxBody = 64 << 20

// Backend holds the sandboxes' files and runs their commands.
type Backend interface {
	provider.Provider
	provider.Snapshotter
}

// Options configure a Server. The zero value is usable.
type Options struct {
	// APIKey, when set, is required in OPEN-SANDBOX-API-KEY.
	APIKey string
	// Clock decides state changes and lease expiry; default clock.Real{}.
	Clock clock.Clock
	// CreateLatency is how long a new sandbox stays Pending.
	CreateLatency time.Duration
	// SnapshotLatency is how long one capture takes.
	SnapshotLatency time.Duration
	// CaptureWorkers is how many captures run at once (default 2, as
	// upstream's snapshot worker pool).
	CaptureWorkers int
	// LowerCaseStates spells states "running", "ready", ...
	LowerCaseStates bool
	// PendingState, when set, is what a sandbox reports instead of Pending
	// while it starts: a state the spec does not list, which clients must
	// accept.
	PendingState string
	// Backend holds files and runs commands; default an in-memory fake
	// provider. Sandbox and snapshot ids are the backend's.
	Backend Backend
	// Listener, when set, is where the server listens (default a free
	// port on 127.0.0.1).
	Listener net.Listener
	// SyncWithBackend makes a listing backend the runtime of record: before
	// answering, the server drops what the backend no longer has and adopts
	// what it has that the server never recorded (as a server listing its
	// runtime's containers would). For a backend that others change too
	// (the simulation's fault-injecting fake); it costs a listing per call.
	SyncWithBackend bool
	// NoSnapshots answers snapshot requests 501 SNAPSHOT::NOT_IMPLEMENTED,
	// as a runtime without snapshots does.
	NoSnapshots bool
}

// Fault makes matching requests fail. Method "" matches any method; Path is
// a prefix of the request path.
type Fault struct {
	Method string
	Path   string
	// Status is answered (with a {code,message} body), unless Drop.
	Status int
	// RetryAfter, if > 0, is sent as Retry-After seconds.
	RetryAfter int
	// AfterEffect serves the request, then answers Status instead.
	AfterEffect bool
	// Drop closes the connection without an answer.
	Drop bool
	// Times is how many requests it hits (default 1).
	Times int
}

// Stats are the server's counters.
type Stats struct {
	LiveSandboxes, LiveSnapshots int
	// Created counts sandboxes created, Restored those from a snapshot,
	// Deleted those deleted by a client, Expired those whose lease ran out.
	Created, Restored, Deleted, Expired int
	// SnapshotsCreated counts snapshot requests accepted.
	SnapshotsCreated int
	// PeakCaptures is the most captures that ever ran at once.
	PeakCaptures int
	// PeakUnfinished is the most snapshots Creating (capturing or queued)
	// seen when a new one was requested: the client's snapshot parallelism.
	PeakUnfinished int
	// PeakStarting is the most sandboxes starting (not yet Running) seen
	// when a new one was requested: the client's create parallelism.
	PeakStarting int
	// Requests counts requests per "METHOD route".
	Requests map[string]int
}

// Server is a fake OpenSandbox server on loopback. Create it with NewServer
// and Close it when done.
type Server struct {
	// URL is the base URL, http://127.0.0.1:port (the lifecycle API is
	// under /v1).
	URL string
	// Domain is host:port, what sandbox.opensandbox.domain takes.
	Domain string

	ts      *httptest.Server
	opts    Options
	clk     clock.Clock
	backend Backend

	mu         sync.Mutex
	sandboxes  map[string]*sandbox
	snapshots  map[string]*snapshot
	seq        int
	workers    []time.Time
	captures   [][2]time.Time
	violations []string
	commands   runningCommands
	failCreate int
	failSnap   int
	faults     []*Fault
	stats      Stats
	bodies     map[string][][]byte
}

type sandbox struct {
	id         string
	seq        int
	createdAt  time.Time
	readyAt    time.Time
	expiresAt  time.Time // zero: manual cleanup
	metadata   map[string]string
	env        map[string]string
	entrypoint []string
	image      string
	snapshotID string
	failed     bool
	// exited is the state of a sandbox whose entrypoint ended: Terminated
	// or Failed (from the entrypoint, or Terminate).
	exited  string
	paused  bool
	backend provider.Handle
}

type snapshot struct {
	id        string
	seq       int
	sandboxID string
	name      string
	createdAt time.Time
	// startAt is when its capture begins (after the queue for a worker).
	startAt time.Time
	readyAt time.Time
	failed  bool
	// deleting: a delete was refused (a fork lives on it); the snapshot
	// stays Deleting, no fork is made from it, and a later delete
	// finishes.
	deleting  bool
	backendID string
	// metadata and env are the source's, which a fork inherits (the
	// runtime keeps them in the snapshot's image).
	metadata, env map[string]string
}

// NewServer starts a fake server on 127.0.0.1.
func NewServer(opts Options) *Server {
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.CaptureWorkers <= 0 {
		opts.CaptureWorkers = 2
	}
	if opts.Backend == nil {
		opts.Backend = fake.New(fake.Options{Clock: opts.Clock, IDPrefix: "backend-"})
	}
	s := &Server{
		opts:      opts,
		clk:       opts.Clock,
		backend:   opts.Backend,
		sandboxes: map[string]*sandbox{},
		snapshots: map[string]*snapshot{},
		workers:   make([]time.Time, opts.CaptureWorkers),
		stats:     Stats{Requests: map[string]int{}},
		bodies:    map[string][][]byte{},
	}
	s.ts = httptest.NewUnstartedServer(s.routes())
	if opts.Listener != nil {
		_ = s.ts.Listener.Close()
		s.ts.Listener = opts.Listener
	}
	// Set before serving: a handler reads Domain, and a request from
	// another process has no happens-before edge to a later write.
	s.URL = "http://" + s.ts.Listener.Addr().String()
	s.Domain = strings.TrimPrefix(s.URL, "http://")
	s.ts.Start()
	return s
}

// Close shuts the server down.
func (s *Server) Close() { s.ts.Close() }

// Backend is the backend holding the sandboxes' files.
func (s *Server) Backend() Backend { return s.backend }

// Violations are the departures from the spec seen in requests so far.
func (s *Server) Violations() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.violations...)
}

// FailNextCreates makes the next n sandboxes end Failed instead of Running.
func (s *Server) FailNextCreates(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failCreate += n
}

// FailNextSnapshots makes the next n snapshots end Failed.
func (s *Server) FailNextSnapshots(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failSnap += n
}

// Inject adds a fault.
func (s *Server) Inject(f Fault) {
	if f.Times <= 0 {
		f.Times = 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, &f)
}

// ClearFaults removes every fault injected and not yet spent.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
}

// Stats returns the counters (after reaping expired sandboxes).
func (s *Server) Stats() Stats {
	s.reap()
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Requests = maps.Clone(s.stats.Requests)
	st.LiveSandboxes, st.LiveSnapshots = len(s.sandboxes), len(s.snapshots)
	return st
}

// Requests returns the JSON bodies received on a route ("POST /sandboxes"),
// in order.
func (s *Server) Requests(route string) [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]byte(nil), s.bodies[route]...)
}

// SandboxIDs are the live sandboxes, in creation order.
func (s *Server) SandboxIDs() []string {
	s.reap()
	s.mu.Lock()
	defer s.mu.Unlock()
	return idsBySeq(s.sandboxes, func(sb *sandbox) int { return sb.seq })
}

// SnapshotIDs are the snapshots, in creation order.
func (s *Server) SnapshotIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return idsBySeq(s.snapshots, func(sn *snapshot) int { return sn.seq })
}

// SandboxMetadata returns a live sandbox's metadata.
func (s *Server) SandboxMetadata(id string) (map[string]string, bool) {
	s.reap()
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if !ok {
		return nil, false
	}
	return maps.Clone(sb.metadata), true
}

// BackendHandle is the backend's handle of a live sandbox, for reading its
// files in a test.
func (s *Server) BackendHandle(id string) (provider.Handle, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if !ok {
		return provider.Handle{}, false
	}
	return sb.backend, true
}

func idsBySeq[T any](m map[string]T, seq func(T) int) []string {
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return seq(m[ids[i]]) < seq(m[ids[j]]) })
	return ids
}

func (s *Server) state(name string) string {
	if s.opts.LowerCaseStates {
		return strings.ToLower(name)
	}
	return name
}

func (s *Server) sandboxState(sb *sandbox, now time.Time) string {
	switch {
	case now.Before(sb.readyAt) && s.opts.PendingState != "":
		return s.opts.PendingState
	case now.Before(sb.readyAt):
		return s.state("Pending")
	case sb.failed:
		return s.state("Failed")
	case sb.exited != "":
		return s.state(sb.exited)
	case sb.paused || s.capturing(sb.id, now):
		// The runtime pauses a snapshot's source while it captures.
		return s.state("Paused")
	}
	return s.state("Running")
}

// capturing reports whether a snapshot of the sandbox is being captured (a
// queued one does not pause its source yet).
func (s *Server) capturing(id string, now time.Time) bool {
	for _, sn := range s.snapshots {
		if sn.sandboxID == id && !now.Before(sn.startAt) && now.Before(sn.readyAt) {
			return true
		}
	}
	return false
}

// Terminate ends the sandboxes' entrypoints, as a restart of the runtime
// does (every container comes back Terminated): they stay listed, their
// execd is gone (the backend's sandbox is stopped), and only a delete
// removes them. No ids: all of them.
func (s *Server) Terminate(ids ...string) {
	s.mu.Lock()
	var gone []provider.Handle
	for id, sb := range s.sandboxes {
		if (len(ids) == 0 || contains(ids, id)) && sb.exited == "" && !sb.failed {
			sb.exited = "Terminated"
			gone = append(gone, sb.backend)
		}
	}
	s.mu.Unlock()
	for _, h := range gone {
		_ = s.backend.Stop(context.Background(), h)
	}
}

func (s *Server) snapshotState(sn *snapshot, now time.Time) string {
	switch {
	case now.Before(sn.readyAt):
		return s.state("Creating")
	case sn.deleting:
		return s.state("Deleting")
	case sn.failed:
		return s.state("Failed")
	}
	return s.state("Ready")
}

func (s *Server) running(sb *sandbox, now time.Time) bool {
	return strings.EqualFold(s.sandboxState(sb, now), "Running")
}

// reap deletes the sandboxes whose lease ran out, as the server's expiry
// timer does.
func (s *Server) reap() {
	now := s.clk.Now()
	var gone []provider.Handle
	s.mu.Lock()
	for id, sb := range s.sandboxes {
		if !sb.expiresAt.IsZero() && !now.Before(sb.expiresAt) {
			delete(s.sandboxes, id)
			s.stats.Expired++
			gone = append(gone, sb.backend)
		}
	}
	s.mu.Unlock()
	for _, h := range gone {
		_ = s.backend.Stop(context.Background(), h)
	}
}

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

// route wraps a handler: counting, faults, auth, lease expiry.
func (s *Server) route(name string, auth bool, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
			if err != nil {
				writeError(w, http.StatusBadRequest, "SANDBOX::INVALID_PARAMETER", "read body: %v", err)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			s.mu.Lock()
			s.bodies[name] = append(s.bodies[name], body)
			s.mu.Unlock()
		}
		s.mu.Lock()
		s.stats.Requests[name]++
		var hit *Fault
		for _, f := range s.faults {
			if f.Times > 0 && (f.Method == "" || f.Method == r.Method) && strings.HasPrefix(r.URL.Path, f.Path) {
				f.Times--
				hit = f
				break
			}
		}
		s.mu.Unlock()
		if auth && s.opts.APIKey != "" {
			switch got := r.Header.Get(APIKeyHeader); {
			case got == "":
				writeError(w, http.StatusUnauthorized, "MISSING_API_KEY", "missing %s", APIKeyHeader)
				return
			case got != s.opts.APIKey:
				writeError(w, http.StatusUnauthorized, "INVALID_API_KEY", "invalid API key")
				return
			}
		}
		if hit != nil {
			if s.fault(w, r, hit, h) {
				return
			}
		}
		s.reap()
		h(w, r)
	}
}

// fault applies f; it returns true when the request was answered.
func (s *Server) fault(w http.ResponseWriter, r *http.Request, f *Fault, h http.HandlerFunc) bool {
	if f.Drop {
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				_ = conn.Close()
				return true
			}
		}
		panic(http.ErrAbortHandler)
	}
	if f.AfterEffect {
		s.reap()
		h(httptest.NewRecorder(), r)
	}
	if f.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(f.RetryAfter))
	}
	writeError(w, f.Status, "INJECTED", "injected fault: %d", f.Status)
	return true
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "healthy"})
	})
	mux.HandleFunc("POST /v1/sandboxes", s.route("POST /sandboxes", true, s.createSandbox))
	mux.HandleFunc("GET /v1/sandboxes", s.route("GET /sandboxes", true, s.listSandboxes))
	mux.HandleFunc("GET /v1/sandboxes/{id}", s.route("GET /sandboxes/{id}", true, s.getSandbox))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", s.route("DELETE /sandboxes/{id}", true, s.deleteSandbox))
	mux.HandleFunc("POST /v1/sandboxes/{id}/renew-expiration", s.route("POST /sandboxes/{id}/renew-expiration", true, s.renew))
	mux.HandleFunc("GET /v1/sandboxes/{id}/endpoints/{port}", s.route("GET /sandboxes/{id}/endpoints/{port}", true, s.endpoint))
	mux.HandleFunc("POST /v1/sandboxes/{id}/snapshots", s.route("POST /sandboxes/{id}/snapshots", true, s.createSnapshot))
	mux.HandleFunc("GET /v1/snapshots", s.route("GET /snapshots", true, s.listSnapshots))
	mux.HandleFunc("GET /v1/snapshots/{id}", s.route("GET /snapshots/{id}", true, s.getSnapshot))
	mux.HandleFunc("DELETE /v1/snapshots/{id}", s.route("DELETE /snapshots/{id}", true, s.deleteSnapshot))
	// execd, through the server proxy (no API key, as upstream) and
	// "directly" (a per-sandbox path prefix, as a Docker bridge endpoint).
	mux.HandleFunc("/sandboxes/{id}/proxy/{port}/{path...}", s.route("execd (proxy)", false, s.execd))
	mux.HandleFunc("/direct/{id}/proxy/{port}/{path...}", s.route("execd (direct)", false, s.execd))
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", s.route("POST /sandboxes/{id}/pause", true, s.pause))
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", s.route("POST /sandboxes/{id}/resume", true, s.resume))
	mux.HandleFunc("PATCH /v1/sandboxes/{id}/metadata", s.route("PATCH /sandboxes/{id}/metadata", true, s.patchMetadata))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.note(r, "no such route in the spec")
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
	})
	return mux
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
	id := r.PathValue("id")
	s.sync(r.Context())
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	s.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, codeSandboxNotFound, "sandbox %s not found", id)
	}
	return sb, ok
}

// sync makes the records agree with a backend that can list: records of
// sandboxes and snapshots it no longer has are dropped, and what it has that
// the server never recorded is adopted (Running, Ready).
func (s *Server) sync(ctx context.Context) {
	l := s.backend.Capabilities().Lister
	if l == nil || !s.opts.SyncWithBackend {
		return
	}
	sbs, err1 := l.ListSandboxes(ctx)
	snaps, err2 := l.ListSnapshots(ctx)
	if err1 != nil || err2 != nil {
		return
	}
	now := s.clk.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	live := map[string]bool{}
	for _, info := range sbs {
		live[info.Handle.SandboxID] = true
		if _, ok := s.sandboxes[info.Handle.SandboxID]; ok {
			continue
		}
		s.seq++
		s.sandboxes[info.Handle.SandboxID] = &sandbox{
			id: info.Handle.SandboxID, seq: s.seq, createdAt: info.CreatedAt, readyAt: info.CreatedAt,
			expiresAt: info.ExpiresAt, metadata: maps.Clone(info.Metadata), entrypoint: []string{"tail", "-f", "/dev/null"},
			snapshotID: info.FromSnapshot, backend: info.Handle,
		}
		if info.FromSnapshot == "" {
			s.sandboxes[info.Handle.SandboxID].image = "adopted"
		}
	}
	for id := range s.sandboxes {
		if !live[id] {
			delete(s.sandboxes, id)
		}
	}
	have := map[string]bool{}
	for _, info := range snaps {
		have[info.ID] = true
		if _, ok := s.snapshots[info.ID]; ok {
			continue
		}
		s.seq++
		s.snapshots[info.ID] = &snapshot{id: info.ID, seq: s.seq, sandboxID: info.SandboxID, name: info.Name,
			createdAt: info.CreatedAt, readyAt: info.CreatedAt, backendID: info.ID}
	}
	for id, sn := range s.snapshots {
		if !have[sn.backendID] && !now.Before(sn.readyAt) {
			delete(s.snapshots, id)
		}
	}
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
		if l := s.backend.Capabilities().Leaser; l != nil {
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
	ep := fmt.Sprintf("%s/direct/%s/proxy/%d", s.Domain, sb.id, port)
	if proxy {
		ep = fmt.Sprintf("%s/sandboxes/%s/proxy/%d", s.Domain, sb.id, port)
	}
	writeJSON(w, http.StatusOK, map[string]any{"endpoint": ep})
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	req, ok := s.readChecked(w, r, createSnapshotSchema, true)
	if !ok {
		return
	}
	sb, ok := s.lookup(w, r)
	if !ok {
		return
	}
	now := s.clk.Now()
	s.mu.Lock()
	running := s.running(sb, now)
	st := s.sandboxState(sb, now)
	s.mu.Unlock()
	if !running {
		writeError(w, http.StatusConflict, "SNAPSHOT::INVALID_SOURCE_STATE", "sandbox %s is %s, not Running", sb.id, st)
		return
	}
	if s.opts.NoSnapshots {
		writeError(w, http.StatusNotImplemented, "SNAPSHOT::NOT_IMPLEMENTED", "this runtime takes no snapshots")
		return
	}
	name, _ := req["name"].(string)
	backendID, err := s.backend.Snapshot(r.Context(), sb.backend, name)
	if err != nil {
		s.backendError(w, "SNAPSHOT::CREATE_FAILED", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	unfinished, at := 1, s.clk.Now()
	for _, o := range s.snapshots {
		if at.Before(o.readyAt) {
			unfinished++
		}
	}
	s.stats.PeakUnfinished = max(s.stats.PeakUnfinished, unfinished)
	// The capture takes the first free worker; until one frees, it queues.
	w0 := 0
	for i, t := range s.workers {
		if t.Before(s.workers[w0]) {
			w0 = i
		}
	}
	start := now
	if s.workers[w0].After(now) {
		start = s.workers[w0]
	}
	s.seq++
	sn := &snapshot{
		id:        backendID,
		seq:       s.seq,
		sandboxID: sb.id,
		name:      name,
		createdAt: now,
		startAt:   start,
		readyAt:   start.Add(s.opts.SnapshotLatency),
		backendID: backendID,
		metadata:  maps.Clone(sb.metadata),
		env:       maps.Clone(sb.env),
	}
	s.workers[w0] = sn.readyAt
	s.captures = append(s.captures, [2]time.Time{start, sn.readyAt})
	s.stats.PeakCaptures = max(s.stats.PeakCaptures, overlapping(s.captures, start))
	if s.failSnap > 0 {
		s.failSnap--
		sn.failed = true
	}
	s.snapshots[sn.id] = sn
	s.stats.SnapshotsCreated++
	w.Header().Set("Location", "/v1/snapshots/"+sn.id)
	writeJSON(w, http.StatusAccepted, s.snapshotJSON(sn, now))
}

// overlapping counts the captures running at t.
func overlapping(captures [][2]time.Time, t time.Time) int {
	n := 0
	for _, c := range captures {
		if !t.Before(c[0]) && t.Before(c[1]) {
			n++
		}
	}
	return n
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.sync(r.Context())
	s.mu.Lock()
	defer s.mu.Unlock()
	sn, ok := s.snapshots[id]
	if !ok {
		writeError(w, http.StatusNotFound, "SNAPSHOT::NOT_FOUND", "snapshot %s not found", id)
		return
	}
	writeJSON(w, http.StatusOK, s.snapshotJSON(sn, s.clk.Now()))
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.sync(r.Context())
	now := s.clk.Now()
	s.mu.Lock()
	sn, ok := s.snapshots[id]
	switch {
	case !ok:
		s.mu.Unlock()
		writeError(w, http.StatusNotFound, "SNAPSHOT::NOT_FOUND", "snapshot %s not found", id)
		return
	case now.Before(sn.readyAt):
		s.mu.Unlock()
		writeError(w, http.StatusConflict, "SNAPSHOT::INVALID_STATE", "snapshot %s is still Creating", id)
		return
	case s.forked(id):
		sn.deleting = true
		s.mu.Unlock()
		writeError(w, http.StatusConflict, "SNAPSHOT::DELETE_CONFLICT", "snapshot %s is in use by a sandbox forked from it", id)
		return
	}
	s.mu.Unlock()
	if err := s.backend.DeleteSnapshot(r.Context(), sn.backendID); err != nil {
		s.backendError(w, "SNAPSHOT::DELETE_FAILED", err)
		return
	}
	s.mu.Lock()
	delete(s.snapshots, id)
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// forked reports whether a listed sandbox was forked from the snapshot (the
// runtime cannot remove an image a container uses, even an exited one).
func (s *Server) forked(snapshotID string) bool {
	for _, sb := range s.sandboxes {
		if sb.snapshotID == snapshotID {
			return true
		}
	}
	return false
}

// paging reads page and pageSize (1-200, default 20).
func (s *Server) paging(w http.ResponseWriter, r *http.Request) (page, size int, ok bool) {
	page, size = 1, 20
	q := r.URL.Query()
	for _, f := range []struct {
		name string
		dst  *int
		max  int
	}{{"page", &page, 1 << 30}, {"pageSize", &size, 200}} {
		v := q.Get(f.name)
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > f.max {
			s.note(r, fmt.Sprintf("%s=%q is out of range", f.name, v))
			writeInvalid(w, fmt.Sprintf("%s must be 1-%d", f.name, f.max))
			return 0, 0, false
		}
		*f.dst = n
	}
	return page, size, true
}

func pageOf[T any](items []T, page, size int) ([]T, map[string]any) {
	total := len(items)
	from := min((page-1)*size, total)
	to := min(from+size, total)
	pages := (total + size - 1) / size
	return items[from:to], map[string]any{
		"page": page, "pageSize": size, "totalItems": total, "totalPages": pages, "hasNextPage": page < pages,
	}
}

// states returns the state filter, or nil for none. Matching is
// case-insensitive.
func states(q url.Values) []string { return q["state"] }

func matchLabels(md map[string]string, want url.Values) bool {
	for k := range want {
		if v, ok := md[k]; !ok || v != want.Get(k) {
			return false
		}
	}
	return true
}

func matchState(filter []string, st string) bool {
	if len(filter) == 0 {
		return true
	}
	for _, f := range filter {
		if strings.EqualFold(f, st) {
			return true
		}
	}
	return false
}

// newestFirst orders ids as the real server lists: the newest first.
func newestFirst(ids []string) []string {
	slices.Reverse(ids)
	return ids
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
	pageItems, pag := pageOf(items, page, size)
	if pageItems == nil {
		pageItems = []map[string]any{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": pageItems, "pagination": pag})
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	page, size, ok := s.paging(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	filter, source := states(q), q.Get("sandboxId")
	s.sync(r.Context())
	now := s.clk.Now()
	s.mu.Lock()
	var items []map[string]any
	for _, id := range newestFirst(idsBySeq(s.snapshots, func(sn *snapshot) int { return sn.seq })) {
		sn := s.snapshots[id]
		if matchState(filter, s.snapshotState(sn, now)) && (source == "" || sn.sandboxID == source) {
			items = append(items, s.snapshotJSON(sn, now))
		}
	}
	s.mu.Unlock()
	pageItems, pag := pageOf(items, page, size)
	if pageItems == nil {
		pageItems = []map[string]any{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": pageItems, "pagination": pag})
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
