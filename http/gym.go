package http

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	nethttp "net/http"
	"regexp"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/aggregate"
	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/internal/jsonr"
	"github.com/sandboxowner/owner/problem"
	"github.com/sandboxowner/owner/resources"
)

// Gym's routes besides the session routes.
const (
	RouteLiveness         = "/"
	RouteAggregateMetrics = "/aggregate_metrics"
	RouteReverifyMode     = "/reverify_mode"

	// CodeSessionConflict: a typed seed names a session already seeded for
	// another episode or task.
	CodeSessionConflict = "session_conflict"
)

// Reverify modes (Gym's ReverifyMode): whether a rollout can be graded again
// from its stored verify request.
const (
	ReverifyStateless   = "stateless"
	ReverifyUnsupported = "unsupported"
)

func (s *Server) liveness(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() && !ctx.IsHead() {
		methodNotAllowed(ctx, "GET")
		return
	}
	writeJSON(ctx, nethttp.StatusOK, map[string]any{"status": "ok", "name": s.res.Name()})
}

// reverifyMode answers the mode as Gym does, a bare JSON string: a server
// whose verify grades what the request carries (VerifyReplayable) can
// regrade; one that grades a sandbox it then ends cannot.
func (s *Server) reverifyMode(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() && !ctx.IsHead() {
		methodNotAllowed(ctx, "GET")
		return
	}
	mode := ReverifyUnsupported
	if s.res.VerifyReplayable() {
		mode = ReverifyStateless
	}
	writeJSON(ctx, nethttp.StatusOK, mode)
}

// aggregateMetrics computes Gym's aggregate of verify responses. It touches
// no session: no cookie, no admission.
func (s *Server) aggregateMetrics(ctx *fasthttp.RequestCtx) {
	if !ctx.IsPost() {
		methodNotAllowed(ctx, "POST")
		return
	}
	var req struct {
		VerifyResponses *[]map[string]any `json:"verify_responses"`
	}
	dec := json.NewDecoder(bytes.NewReader(ctx.PostBody()))
	dec.UseNumber()
	if err := dec.Decode(&req); err != nil {
		s.fail(ctx, resources.Invalid("%s", resources.JSONProblem(err)))
		return
	}
	if req.VerifyResponses == nil {
		s.fail(ctx, resources.Invalid("verify_responses is required"))
		return
	}
	m, err := aggregate.Compute(*req.VerifyResponses)
	if err != nil {
		s.fail(ctx, resources.Invalid("%v", err))
		return
	}
	writeJSON(ctx, nethttp.StatusOK, m)
}

// typedSeed is Gym's ResourcesSeedSessionRequest: the session is named by
// the caller and bound to an episode and a task; task_data is the row.
type typedSeed struct {
	ResourcesSessionID string          `json:"resources_session_id"`
	EpisodeID          json.RawMessage `json:"episode_id"`
	TaskID             *TaskID         `json:"task_id"`
	TaskData           json.RawMessage `json:"task_data"`

	episode control.EpisodeID
}

// TaskID names a task of a taskset.
type TaskID struct {
	Taskset string `json:"taskset"`
	TaskID  string `json:"task_id"`
}

// TypedSeedReply is Gym's ResourcesSeedSessionResponse.
type TypedSeedReply struct {
	ResourcesSessionID string `json:"resources_session_id"`
	// ResourcesTools says how to call the server's tools over MCP (null
	// for a server without tools).
	ResourcesTools *ResourcesTools `json:"resources_tools"`
	// SandboxAccess is what /sandbox_access answers (null for a server
	// that lends no sandbox).
	SandboxAccess *Access `json:"sandbox_access"`
}

// sessionIDPattern bounds a caller-named session id: it becomes a sandbox
// label and a cookie.
var sessionIDPattern = regexp.MustCompile(fmt.Sprintf(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,%d}$`, MaxSessionIDLen-1))

// parseTypedSeed returns the typed request a seed body holds, or nil for a
// legacy body (a dataset row, which never has resources_session_id). A typed
// body is strict: extra keys, a missing field or a bad id are a 422.
func parseTypedSeed(body []byte) (*typedSeed, error) { return parseTyped(body, true) }

// parseTyped is parseTypedSeed; fast false decodes with encoding/json only,
// which the hand-written reader must agree with.
func parseTyped(body []byte, fast bool) (*typedSeed, error) {
	t, err := decodeTypedSeed(body, fast)
	if t == nil || err != nil {
		return nil, err
	}
	switch {
	case !sessionIDPattern.MatchString(t.ResourcesSessionID):
		return nil, resources.Invalid("resources_session_id must match %s", sessionIDPattern)
	case t.TaskID == nil || t.TaskID.Taskset == "" || t.TaskID.TaskID == "":
		return nil, resources.Invalid("task_id {taskset, task_id} is required")
	case len(bytes.TrimSpace(t.TaskData)) == 0 || bytes.TrimSpace(t.TaskData)[0] != '{':
		return nil, resources.Invalid("task_data must be an object")
	}
	ep, ok, err := parseEpisode(t.EpisodeID, fast)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, resources.Invalid("episode_id is required")
	}
	t.episode = ep
	return t, nil
}

// parseEpisodeField reads an episode_id: an EpisodeId object or a capture
// key; absent or null is no episode.
func parseEpisodeField(raw json.RawMessage) (control.EpisodeID, bool, error) {
	return parseEpisode(raw, true)
}

func parseEpisode(raw json.RawMessage, fast bool) (control.EpisodeID, bool, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return control.EpisodeID{}, false, nil
	}
	if fast && json.Valid(raw) {
		if e, ok := readEpisode(raw); ok {
			if err := e.Validate(); err != nil {
				return control.EpisodeID{}, false, resources.Invalid("episode_id: %v", err)
			}
			return e, true, nil
		}
		if key, ok := jsonr.String(raw); ok {
			e, err := control.ParseCaptureKey(string(key))
			if err != nil {
				return control.EpisodeID{}, false, resources.Invalid("episode_id: %v", err)
			}
			return e, true, nil
		}
	}
	if raw[0] == '"' {
		var key string
		if err := json.Unmarshal(raw, &key); err != nil {
			return control.EpisodeID{}, false, resources.Invalid("episode_id: %s", resources.JSONProblem(err))
		}
		e, err := control.ParseCaptureKey(key)
		if err != nil {
			return control.EpisodeID{}, false, resources.Invalid("episode_id: %v", err)
		}
		return e, true, nil
	}
	var e control.EpisodeID
	if err := json.Unmarshal(raw, &e); err != nil {
		return control.EpisodeID{}, false, resources.Invalid("episode_id: %s", resources.JSONProblem(err))
	}
	if err := e.Validate(); err != nil {
		return control.EpisodeID{}, false, resources.Invalid("episode_id: %v", err)
	}
	return e, true, nil
}

// typedBinding is what a typed session was seeded for.
type typedBinding struct {
	episode string
	task    TaskID
}

// typedSessions remembers each typed session's episode and task until it is
// closed (a verify does not free the id), so that a repeated seed is
// idempotent and one for another episode or task is refused.
type typedSessions struct {
	mu    sync.Mutex
	bound map[string]typedBinding
}

func newTypedSessions() *typedSessions { return &typedSessions{bound: map[string]typedBinding{}} }

// claim binds id to b; fresh reports whether it was unbound before.
func (t *typedSessions) claim(id string, b typedBinding) (fresh bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.bound[id]; ok {
		if old != b {
			return false, problem.Errorf(nethttp.StatusConflict, CodeSessionConflict,
				"session %s was seeded for episode %s, task %s/%s", id, old.episode, old.task.Taskset, old.task.TaskID)
		}
		return false, nil
	}
	t.bound[id] = b
	return true, nil
}

func (t *typedSessions) forget(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.bound, id)
}

// seedTyped serves a typed seed: the resources server seeds the session
// from task_data, and the reply carries the sandbox access.
func (s *Server) seedTyped(ctx context.Context, sess *resources.Session, t *typedSeed) (any, error) {
	fresh, err := s.typed.claim(sess.ID, typedBinding{episode: t.episode.CaptureKey(), task: *t.TaskID})
	if err != nil {
		return nil, err
	}
	if _, err := s.res.Seed(ctx, sess, t.TaskData); err != nil {
		if fresh {
			s.typed.forget(sess.ID)
		}
		return nil, err
	}
	rep := TypedSeedReply{ResourcesSessionID: sess.ID, ResourcesTools: s.resourcesTools(sess.ID)}
	if s.res.LendsSandboxes() {
		a, err := s.sandboxAccess(ctx, sess)
		var he *problem.Error
		switch {
		case errors.As(err, &he) && he.Code == CodeNoSandboxAccess:
		case err != nil:
			return nil, err
		default:
			rep.SandboxAccess = a
		}
	}
	return rep, nil
}
