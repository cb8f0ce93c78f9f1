package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandboxapi"
)

// The agent's side of lending: the sandbox exec API (sandboxapi.Handler) as
// the server mounts it, over the current owner and participant, called in
// memory with a request the simulation builds (no socket).

// handler is the sandbox API of the current owner: tokens of the run,
// sandboxes resolved from the owner's memory, execs admitted through the
// participant's gate.
func (r *run) handler() *sandboxapi.Handler {
	resolve := sandboxapi.ResolverOf(r.o)
	if r.sabotageResolve != nil {
		resolve = r.sabotageResolve(r)
	}
	return &sandboxapi.Handler{
		Provider: r.o.SharedProvider(),
		Tokens:   r.tokens,
		Resolve:  resolve,
		Admit: func(ctx context.Context, sandboxID string) (func(), error) {
			session, _, _ := r.o.SandboxFate(sandboxID)
			return r.part.AdmitSandboxCall(ctx, session)
		},
	}
}

// agentExec runs command in sandbox id as an agent holding a genuine token
// for it would, and returns the status and body of the answer.
func (r *run) agentExec(id, command string) (int, []byte) {
	var rc fasthttp.RequestCtx
	rc.Request.Header.SetMethod(fasthttp.MethodPost)
	rc.Request.SetRequestURI(sandboxapi.Endpoint("", id) + "/exec")
	rc.Request.Header.Set(fasthttp.HeaderAuthorization, "Bearer "+r.tokens.Mint(id, r.clk.Now().Add(time.Hour)))
	body, _ := json.Marshal(map[string]string{"command": command})
	rc.Request.SetBody(body)
	r.handler().Serve(&rc)
	return rc.Response.StatusCode(), append([]byte(nil), rc.Response.Body()...)
}

// agentExecPlan is what one agent exec chose: a sandbox the owner once
// lent, and the session it was lent to.
type agentExecPlan struct{ id, sid string }

// agentExecuted is what an agent's exec saw: whether the sandbox was the
// session's current one, the answer, and whether the call reached the
// provider.
type agentExecuted struct {
	current, reached bool
	status           int
	body             []byte
}

// opAgentExec has an agent exec in a sandbox the owner once lent, in the
// simulation's one shape; it arms nothing: choose, act, check.
func (r *run) opAgentExec() {
	p, ok := r.chooseAgentExec()
	if !ok {
		return
	}
	r.checkAgentExec(p, r.actAgentExec(p))
}

func (r *run) chooseAgentExec() (agentExecPlan, bool) {
	if len(r.lent) == 0 {
		return agentExecPlan{}, false
	}
	id := sample(r.rng, slices.Sorted(maps.Keys(r.lent)))
	return agentExecPlan{id: id, sid: r.lent[id]}, true
}

func (r *run) actAgentExec(p agentExecPlan) (x agentExecuted) {
	if r.m.sessions[p.sid].live {
		if sb, err := r.o.RequireSessionSandbox(r.life, p.sid); err == nil && sb.Handle.SandboxID == p.id {
			x.current = true
		}
	}
	before := r.calls.count(fake.OpExec, p.id)
	x.status, x.body = r.agentExec(p.id, "cat "+tokenFile)
	x.reached = r.calls.count(fake.OpExec, p.id) > before
	r.tracef("agent exec in %s of %s (current %v): %d %s", p.id, p.sid, x.current, x.status, x.body)
	return x
}

// checkAgentExec holds an agent's exec to the model: the session's current
// sandbox runs the command (and reads the session's token); any other
// (ended, superseded, or a crashed process's) is refused before the call
// reaches the provider.
func (r *run) checkAgentExec(p agentExecPlan, x agentExecuted) {
	if x.current {
		var res provider.ExecResult
		// The token file has no final newline, which OpenSandbox's execd
		// cannot carry: its client ends every line of output with one.
		if err := json.Unmarshal(x.body, &res); err != nil || x.status != fasthttp.StatusOK || res.ExitCode != 0 || strings.TrimSuffix(res.Stdout, "\n") != r.m.sessions[p.sid].token {
			r.violate(LiveState, "an agent's exec in %s, the sandbox of live session %s: %d %s, want 200 with token %q", p.id, p.sid, x.status, x.body, r.m.sessions[p.sid].token)
		}
		return
	}
	if x.reached || (x.status != fasthttp.StatusGone && x.status != fasthttp.StatusNotFound) {
		r.violate(StaleAccess, "an agent's exec in %s, no longer the sandbox of session %s, answered %d %s (reached the provider: %v; want 410 or 404 before it)", p.id, p.sid, x.status, x.body, x.reached)
	}
}

// agentHeldExec is heldExec's call: an exec of the token file through the
// sandbox API; it fails unless it ran and exited 0.
func (r *run) agentHeldExec(id string) error {
	status, body := r.agentExec(id, "cat "+tokenFile)
	if status != fasthttp.StatusOK {
		return fmt.Errorf("status %d: %s", status, body)
	}
	var res provider.ExecResult
	if err := json.Unmarshal(body, &res); err != nil || res.ExitCode != 0 {
		return fmt.Errorf("exec: %s (%v)", body, err)
	}
	return nil
}
