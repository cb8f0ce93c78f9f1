package opensandboxtest

import (
	"bytes"
	"context"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
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
	// ExecdHeaders, when set, are named by every endpoint answer and
	// required of every execd request (401 otherwise), as under a runtime
	// whose execd has an access token.
	ExecdHeaders map[string]string
	// ProxyNeedsAPIKey makes the server proxy's execd routes require the
	// API key as the lifecycle routes do, as a gateway in front of the
	// server may.
	ProxyNeedsAPIKey bool
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
	// AfterEffect serves the request, then answers Status instead (or
	// drops the connection, with Drop).
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
	cuts       []int
	faults     []*Fault
	stats      Stats
	bodies     map[string][][]byte
	// ports models the host ports of direct endpoints: an endpoint's key
	// (the path segment after /direct/) that Reassign moved, and the
	// sandbox that now answers there ("" for none); keys names a
	// sandbox's endpoint key when it is not its id.
	ports, keys map[string]string
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
		ports:     map[string]string{},
		keys:      map[string]string{},
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

// CutNextCommandStreams makes the next n command streams end after their
// first keep events (init is the first, a ping the second), cleanly and
// without the rest (output, the final event), as the real execd ends a
// stream once it takes its request's context for done: it writes no event
// after that, headers included when none was written yet, and still runs
// the command to its end. GET /command/status/{id} says how it ended.
func (s *Server) CutNextCommandStreams(n, keep int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for range n {
		s.cuts = append(s.cuts, keep)
	}
}

// nextCut is how many events the next command stream keeps (-1: all).
func (s *Server) nextCut() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.cuts) == 0 {
		return -1
	}
	keep := s.cuts[0]
	s.cuts = s.cuts[1:]
	return keep
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
	if f.AfterEffect {
		s.reap()
		h(httptest.NewRecorder(), r)
	}
	if f.Drop {
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				_ = conn.Close()
				return true
			}
		}
		panic(http.ErrAbortHandler)
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
	mux.HandleFunc("/sandboxes/{id}/proxy/{port}/{path...}", s.route("execd (proxy)", s.opts.ProxyNeedsAPIKey, s.execd))
	mux.HandleFunc("/direct/{key}/proxy/{port}/{path...}", s.route("execd (direct)", false, s.execd))
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", s.route("POST /sandboxes/{id}/pause", true, s.pause))
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", s.route("POST /sandboxes/{id}/resume", true, s.resume))
	mux.HandleFunc("PATCH /v1/sandboxes/{id}/metadata", s.route("PATCH /sandboxes/{id}/metadata", true, s.patchMetadata))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.note(r, "no such route in the spec")
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
	})
	return mux
}
