package harness

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/provider/fake"
)

// Routes and control operations the scale section reports.
const (
	scaleSeed    = "seed_session"
	scaleAppend  = "append_note"
	scaleReseed  = "re-seed after restore"
	scaleVerify  = "verify"
	scaleCommit  = "prepare+commit+resume"
	scaleRestore = "restore+resume"
	scaleCkptID  = "scale-ck"
)

// scaleCkptDir is the controller's checkpoint directory, beside the
// clients' state file.
func scaleCkptDir(state string) string { return filepath.Join(filepath.Dir(state), "scale-ck") }

// scalePhase is what a scale child reports of its phase.
type scalePhase struct {
	Routes     map[string]LoadResult    `json:"routes"`
	Control    map[string]time.Duration `json:"control_ns"`
	Errors     int                      `json:"errors"`
	FirstError string                   `json:"first_error,omitempty"`
	Verified   int                      `json:"verified"`
}

// ScaleResult is the scale section: Sessions notes sessions seeded over
// HTTP by a load generator in its own process, Active of them making tool
// calls, a commit, a restore into a fresh server on the same state and
// provider, and every session verified.
type ScaleResult struct {
	Sessions, Active int
	Load             time.Duration // how long the active sessions made calls
	Routes           map[string]LoadResult
	Control          map[string]time.Duration
	// RSSPer is the server process's resident memory per live session after
	// the seeding and the calls (the fake's in-memory sandboxes included).
	RSSPer   float64
	Verified int
	Errors   int
	// FirstError is the first error either phase met.
	FirstError string
	LoadStart  string
	LoadEnd    string
}

func scaleShape(mode string) (sessions, active int, load time.Duration) {
	switch mode {
	case ModeTiny:
		return 40, 8, 300 * time.Millisecond
	case ModeQuick:
		return 10000, 1024, 3 * time.Second
	}
	return 10000, 1024, 10 * time.Second
}

// scale runs the section: the server in this process (as cmd/server would
// run it), the load generator a child process.
func (h *harness) scale(ctx context.Context) (*ScaleResult, error) {
	n, active, load := scaleShape(h.opts.Mode)
	res := &ScaleResult{Sessions: n, Active: active, Load: load, Routes: map[string]LoadResult{}, Control: map[string]time.Duration{}, LoadStart: LoadAverage()}
	dir, err := os.MkdirTemp(h.tmp, "scale-")
	if err != nil {
		return nil, err
	}
	state := filepath.Join(dir, "clients.json")
	fk := fake.New(fake.Options{Seed: 1})
	first, crash, err := serveOwner(ctx, filepath.Join(dir, "state"), fk)
	if err != nil {
		return nil, err
	}
	rss0, _, err := settle()
	if err != nil {
		crash()
		return nil, err
	}
	var p1 scalePhase
	err = h.runChild(ctx, &p1, "scale", "-phase", "load", "-addr", first.Addr, "-state", state,
		"-sessions", strconv.Itoa(n), "-active", strconv.Itoa(active), "-duration", load.String())
	if err != nil {
		crash()
		return nil, fmt.Errorf("load phase: %w", err)
	}
	rss1, _, err := settle()
	if err != nil {
		crash()
		return nil, err
	}
	res.RSSPer = float64(rss1-rss0) / float64(n)
	fmt.Fprintf(h.opts.Progress, "scale: %d sessions seeded, %d of them calling for %s; %.1f KiB resident per session; commit %s\n",
		n, active, load, res.RSSPer/1024, fmtDur(p1.Control[scaleCommit]))
	// The server dies without a shutdown; a fresh one restores.
	crash()
	second, _, err := serveOwner(ctx, filepath.Join(dir, "state"), fk)
	if err != nil {
		return nil, fmt.Errorf("restart: %w", err)
	}
	defer second.Close()
	var p2 scalePhase
	err = h.runChild(ctx, &p2, "scale", "-phase", "restore", "-addr", second.Addr, "-state", state, "-sessions", strconv.Itoa(n), "-active", "0")
	if err != nil {
		return nil, fmt.Errorf("restore phase: %w", err)
	}
	for _, p := range []scalePhase{p1, p2} {
		for k, v := range p.Routes {
			res.Routes[k] = v
		}
		for k, v := range p.Control {
			res.Control[k] = v
		}
		res.Errors += p.Errors
		if res.FirstError == "" {
			res.FirstError = p.FirstError
		}
	}
	res.Verified = p2.Verified
	res.LoadEnd = LoadAverage()
	fmt.Fprintf(h.opts.Progress, "scale: restore %s; %d of %d verified; %d errors %s\n", fmtDur(res.Control[scaleRestore]), res.Verified, n, res.Errors, res.FirstError)
	return res, nil
}

// scaleClient is the load generator's view of one session.
type scaleClient struct {
	Cookie  string `json:"cookie"`
	Appends int    `json:"appends"`
}

// scaleGen is the load generator: one connection pool, one cookie per
// session, latencies per route.
type scaleGen struct {
	hc   *fasthttp.HostClient
	addr string

	mu    sync.Mutex
	lats  map[string][]time.Duration
	errs  map[string]int
	first string
}

func newScaleGen(addr string, conns int) *scaleGen {
	return &scaleGen{
		hc: &fasthttp.HostClient{Addr: addr, MaxConns: conns, MaxConnWaitTimeout: time.Minute,
			ReadTimeout: 5 * time.Minute, WriteTimeout: time.Minute, MaxIdleConnDuration: time.Minute},
		addr: addr, lats: map[string][]time.Duration{}, errs: map[string]int{},
	}
}

// post sends body to path with cookie (and the control token when asked)
// and returns the decoded reply and the session cookie it set, if any.
func (g *scaleGen) post(path string, body any, cookie string, control bool) (map[string]any, string, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + g.addr + path)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	b, err := json.Marshal(body)
	if err != nil {
		return nil, "", err
	}
	req.SetBody(b)
	if cookie != "" {
		req.Header.Set("Cookie", cookie)
	}
	if control {
		req.Header.Set("Authorization", "Bearer "+benchControlToken)
	}
	if err := g.hc.Do(req, resp); err != nil {
		return nil, "", fmt.Errorf("%s: %w", path, err)
	}
	set := ""
	for name, raw := range resp.Header.Cookies() {
		ck := fasthttp.AcquireCookie()
		if ck.ParseBytes(raw) == nil {
			set = string(name) + "=" + string(ck.Value())
		}
		fasthttp.ReleaseCookie(ck)
	}
	if code := resp.StatusCode(); code != fasthttp.StatusOK {
		return nil, set, fmt.Errorf("%s: status %d: %.200s", path, code, resp.Body())
	}
	var out map[string]any
	if err := json.Unmarshal(resp.Body(), &out); err != nil {
		return nil, set, fmt.Errorf("%s: reply: %w", path, err)
	}
	return out, set, nil
}

// timed runs one request of route and records its latency or its error.
func (g *scaleGen) timed(route string, fn func() error) error {
	t0 := time.Now()
	err := fn()
	d := time.Since(t0)
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		g.errs[route]++
		if g.first == "" {
			g.first = route + ": " + err.Error()
		}
		return err
	}
	g.lats[route] = append(g.lats[route], d)
	return nil
}

// stats closes a route's window.
func (g *scaleGen) stats(route string, window time.Duration) LoadResult {
	g.mu.Lock()
	defer g.mu.Unlock()
	l := slices.Sorted(slices.Values(g.lats[route]))
	st := LoadResult{Iterations: int64(len(l)), Errors: int64(g.errs[route]), Window: window}
	if len(l) > 0 {
		st.P50, st.P99, st.Max = quantile(l, 0.50), quantile(l, 0.99), l[len(l)-1]
	}
	return st
}

func (g *scaleGen) result(p *scalePhase) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, n := range g.errs {
		p.Errors += n
	}
	p.FirstError = g.first
}

func rollout(i int) string { return fmt.Sprintf("r%05d", i) }

func episodes(n int) []map[string]any {
	eps := make([]map[string]any, n)
	for i := range eps {
		eps[i] = map[string]any{"rollout_id": rollout(i), "attempt": 0}
	}
	return eps
}

func deadlineTS() float64 {
	return float64(time.Now().Add(10*time.Minute).UnixNano()) / 1e9
}

// each runs fn(i) for i < n on workers goroutines; fn's errors are counted
// by the generator, not returned.
func each(n, workers int, fn func(i int)) {
	_ = parallel(n, workers, func(i int) error { fn(i); return nil })
}

// scaleChild runs one phase of the scale section against -addr and prints
// a scalePhase.
func scaleChild(args []string, stdout io.Writer) error {
	var phase, addr, state string
	var n, active int
	var duration time.Duration
	if err := childFlags("scale", args, func(fs *flag.FlagSet) {
		fs.StringVar(&phase, "phase", "load", "load or restore")
		fs.StringVar(&addr, "addr", "", "host:port")
		fs.StringVar(&state, "state", "", "file of the clients' cookies, written by load, read by restore")
		fs.IntVar(&n, "sessions", 10000, "sessions")
		fs.IntVar(&active, "active", 1024, "sessions making tool calls")
		fs.DurationVar(&duration, "duration", 3*time.Second, "how long they make them")
	}); err != nil {
		return err
	}
	if addr == "" || state == "" || n <= 0 || active < 0 || active > n {
		return errors.New("scale: -addr, -state and 0 <= -active <= -sessions > 0 are required")
	}
	g := newScaleGen(addr, max(active, 256))
	p := scalePhase{Routes: map[string]LoadResult{}, Control: map[string]time.Duration{}}
	var err error
	switch phase {
	case "load":
		err = scaleLoadPhase(g, &p, state, n, active, duration)
	case "restore":
		err = scaleRestorePhase(g, &p, state, n)
	default:
		err = fmt.Errorf("scale: unknown phase %q", phase)
	}
	if err != nil {
		return err
	}
	g.result(&p)
	return json.NewEncoder(stdout).Encode(p)
}

func scaleLoadPhase(g *scaleGen, p *scalePhase, state string, n, active int, duration time.Duration) error {
	clients := make([]scaleClient, n)
	t0 := time.Now()
	each(n, 256, func(i int) {
		_ = g.timed(scaleSeed, func() error {
			_, set, err := g.post("/ng-rollout/"+rollout(i)+"/seed_session", map[string]any{}, "", false)
			clients[i].Cookie = set
			return err
		})
	})
	p.Routes[scaleSeed] = g.stats(scaleSeed, time.Since(t0))

	end := time.Now().Add(duration)
	t0 = time.Now()
	each(active, active, func(i int) {
		c := &clients[i]
		for time.Now().Before(end) {
			line := fmt.Sprintf("n%d", c.Appends)
			if g.timed(scaleAppend, func() error {
				_, _, err := g.post("/ng-rollout/"+rollout(i)+"/append_note", map[string]any{"line": line}, c.Cookie, false)
				return err
			}) == nil {
				c.Appends++
			}
		}
	})
	p.Routes[scaleAppend] = g.stats(scaleAppend, time.Since(t0))

	t0 = time.Now()
	err := g.timed(scaleCommit, func() error {
		if _, _, err := g.post(httpapi.ControlPrefix+"prepare", map[string]any{"checkpoint_id": scaleCkptID, "deadline_ts": deadlineTS()}, "", true); err != nil {
			return err
		}
		rep, _, err := g.post(httpapi.ControlPrefix+"commit", map[string]any{"checkpoint_id": scaleCkptID, "deadline_ts": deadlineTS(),
			"checkpoint_dir": scaleCkptDir(state), "episode_ids": episodes(n)}, "", true)
		if err != nil {
			return err
		}
		if m, _ := rep["manifest"].(map[string]any); m == nil || m["record_count"] != float64(n) {
			return fmt.Errorf("commit manifest %v, want %d records", rep["manifest"], n)
		}
		_, _, err = g.post(httpapi.ControlPrefix+"resume", map[string]any{"checkpoint_id": scaleCkptID, "deadline_ts": deadlineTS()}, "", true)
		return err
	})
	p.Control[scaleCommit] = time.Since(t0)
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	b, err := json.Marshal(clients)
	if err != nil {
		return err
	}
	return os.WriteFile(state, b, 0o600)
}

func scaleRestorePhase(g *scaleGen, p *scalePhase, state string, n int) error {
	b, err := os.ReadFile(state)
	if err != nil {
		return err
	}
	var clients []scaleClient
	if err := json.Unmarshal(b, &clients); err != nil || len(clients) != n {
		return fmt.Errorf("scale: %s holds %d clients (%v), want %d", state, len(clients), err, n)
	}
	t0 := time.Now()
	err = g.timed(scaleRestore, func() error {
		rep, _, err := g.post(httpapi.ControlPrefix+"restore", map[string]any{"checkpoint_id": scaleCkptID, "deadline_ts": deadlineTS(),
			"checkpoint_dir": scaleCkptDir(state), "episode_ids": episodes(n)}, "", true)
		if err != nil {
			return err
		}
		if got, _ := rep["restored"].([]any); len(got) != n {
			return fmt.Errorf("restore restored %d episodes, want %d", len(got), n)
		}
		_, _, err = g.post(httpapi.ControlPrefix+"resume", map[string]any{"checkpoint_id": scaleCkptID, "deadline_ts": deadlineTS()}, "", true)
		return err
	})
	p.Control[scaleRestore] = time.Since(t0)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}

	var mu sync.Mutex
	t0 = time.Now()
	each(n, 256, func(i int) {
		c := clients[i]
		attempt := "/ng-rollout/" + rollout(i) + "-a1/"
		if g.timed(scaleReseed, func() error {
			_, _, err := g.post(attempt+"seed_session", map[string]any{}, c.Cookie, false)
			return err
		}) != nil {
			return
		}
		want := make([]string, c.Appends)
		for k := range want {
			want[k] = fmt.Sprintf("n%d", k)
		}
		if g.timed(scaleVerify, func() error {
			rep, _, err := g.post(attempt+"verify", map[string]any{"expected_notes": want, "responses_create_params": map[string]any{}}, c.Cookie, false)
			if err == nil && rep["reward"] != 1.0 {
				err = fmt.Errorf("reward %v, want 1", rep["reward"])
			}
			return err
		}) == nil {
			mu.Lock()
			p.Verified++
			mu.Unlock()
		}
	})
	window := time.Since(t0)
	p.Routes[scaleReseed] = g.stats(scaleReseed, window)
	p.Routes[scaleVerify] = g.stats(scaleVerify, window)
	return nil
}
