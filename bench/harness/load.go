package harness

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// Scenarios the load generator runs. Every client holds its own session
// (its own cookie), like an agent does.
const (
	ScenarioSandboxAccess = "/sandbox_access"
	ScenarioAppendNote    = "/append_note"
	ScenarioSeedClose     = "seed+close"
)

// scenarioNames lists the scenarios in report order.
func scenarioNames() []string {
	return []string{ScenarioSandboxAccess, ScenarioAppendNote, ScenarioSeedClose}
}

// step is one request of a scenario: a POST to the route, with the body a
// client sends there.
type step string

const (
	stepSeed   step = "/seed_session"
	stepClose  step = "/close_session"
	stepAccess step = "/sandbox_access"
	stepAppend step = "/append_note"
)

func (s step) path() string { return string(s) }

func (s step) body() string {
	switch s {
	case stepAppend:
		return `{"line":"bench"}`
	case stepClose:
		return "" // the empty body ends the cookie's session
	}
	return `{}`
}

// scenario: setup once per client (untimed), loop timed, teardown once.
// fresh clears the client's cookie at the start of every loop, so that each
// iteration is a new session.
type scenario struct {
	setup, loop, teardown []step
	fresh                 bool
}

func scenarioNamed(name string) (scenario, error) {
	switch name {
	case ScenarioSandboxAccess:
		return scenario{setup: []step{stepSeed}, loop: []step{stepAccess}, teardown: []step{stepClose}}, nil
	case ScenarioAppendNote:
		return scenario{setup: []step{stepSeed}, loop: []step{stepAppend}, teardown: []step{stepClose}}, nil
	case ScenarioSeedClose:
		return scenario{loop: []step{stepSeed, stepClose}, fresh: true}, nil
	}
	return scenario{}, fmt.Errorf("unknown scenario %q", name)
}

// LoadResult is what one load run measured: iterations (one request, or a
// seed and a close for seed+close) completed within the measured window
// after the warm-up, and their latency.
type LoadResult struct {
	Iterations int64         `json:"iterations"`
	Errors     int64         `json:"errors"`
	FirstError string        `json:"first_error,omitempty"`
	Window     time.Duration `json:"window_ns"`
	P50        time.Duration `json:"p50_ns"`
	P99        time.Duration `json:"p99_ns"`
	Max        time.Duration `json:"max_ns"`
}

// RPS is iterations per second of the window.
func (l LoadResult) RPS() float64 {
	if l.Window <= 0 {
		return 0
	}
	return float64(l.Iterations) / l.Window.Seconds()
}

// client is one simulated agent: one connection's worth of requests and a
// cookie jar of one session.
type client struct {
	hc     *fasthttp.HostClient
	addr   string
	req    *fasthttp.Request
	resp   *fasthttp.Response
	cookie string
}

func (c *client) do(s step) error {
	c.req.Reset()
	c.req.SetRequestURI("http://" + c.addr + s.path())
	c.req.Header.SetMethod(fasthttp.MethodPost)
	if body := s.body(); body != "" {
		c.req.Header.SetContentType("application/json")
		c.req.SetBodyString(body)
	}
	if c.cookie != "" {
		c.req.Header.Set("Cookie", c.cookie)
	}
	if err := c.hc.Do(c.req, c.resp); err != nil {
		return fmt.Errorf("%s: %w", s, err)
	}
	if code := c.resp.StatusCode(); code/100 != 2 {
		return fmt.Errorf("%s: status %d: %.200s", s, code, c.resp.Body())
	}
	for name, raw := range c.resp.Header.Cookies() {
		ck := fasthttp.AcquireCookie()
		if ck.ParseBytes(raw) == nil {
			c.cookie = string(name) + "=" + string(ck.Value())
		}
		fasthttp.ReleaseCookie(ck)
	}
	return nil
}

func (c *client) run(steps []step) error {
	for _, s := range steps {
		if err := c.do(s); err != nil {
			return err
		}
	}
	return nil
}

// loadChild drives -clients concurrent clients at -addr for -warmup plus
// -duration and prints a LoadResult.
func loadChild(args []string, stdout io.Writer) error {
	var addr, name string
	var clients int
	var duration, warmup time.Duration
	if err := childFlags("load", args, func(fs *flag.FlagSet) {
		fs.StringVar(&addr, "addr", "", "host:port")
		fs.StringVar(&name, "scenario", ScenarioSandboxAccess, "scenario")
		fs.IntVar(&clients, "clients", 64, "concurrent clients")
		fs.DurationVar(&duration, "duration", 2*time.Second, "measured time")
		fs.DurationVar(&warmup, "warmup", 500*time.Millisecond, "unmeasured time first")
	}); err != nil {
		return err
	}
	sc, err := scenarioNamed(name)
	if err != nil {
		return err
	}
	if addr == "" || clients <= 0 {
		return fmt.Errorf("load: -addr and a positive -clients are required")
	}
	res, err := runLoad(addr, sc, clients, warmup, duration)
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(res)
}

func runLoad(addr string, sc scenario, clients int, warmup, duration time.Duration) (LoadResult, error) {
	hc := &fasthttp.HostClient{
		Addr: addr, MaxConns: clients, MaxConnWaitTimeout: time.Minute,
		ReadTimeout: time.Minute, WriteTimeout: time.Minute, MaxIdleConnDuration: time.Minute,
	}
	cs := make([]*client, clients)
	for i := range cs {
		cs[i] = &client{hc: hc, addr: addr, req: fasthttp.AcquireRequest(), resp: fasthttp.AcquireResponse()}
	}
	if err := parallel(clients, 32, func(i int) error { return cs[i].run(sc.setup) }); err != nil {
		return LoadResult{}, fmt.Errorf("load setup: %w", err)
	}

	start := time.Now()
	measureFrom, end := start.Add(warmup), start.Add(warmup+duration)
	lats := make([][]time.Duration, clients)
	errs := make([]int64, clients)
	firsts := make([]error, clients)
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				t0 := time.Now()
				if !t0.Before(end) {
					return
				}
				if sc.fresh {
					c.cookie = ""
				}
				err := c.run(sc.loop)
				t1 := time.Now()
				if t0.Before(measureFrom) || t1.After(end) {
					continue
				}
				if err != nil {
					errs[i]++
					if firsts[i] == nil {
						firsts[i] = err
					}
					continue
				}
				lats[i] = append(lats[i], t1.Sub(t0))
			}
		}()
	}
	wg.Wait()

	var res LoadResult
	var all []time.Duration
	for i := range cs {
		all = append(all, lats[i]...)
		res.Errors += errs[i]
		if res.FirstError == "" && firsts[i] != nil {
			res.FirstError = firsts[i].Error()
		}
	}
	res.Iterations, res.Window = int64(len(all)), duration
	if len(all) > 0 {
		slices.Sort(all)
		res.P50, res.P99, res.Max = quantile(all, 0.50), quantile(all, 0.99), all[len(all)-1]
	}
	if err := parallel(clients, 32, func(i int) error { return cs[i].run(sc.teardown) }); err != nil {
		return res, fmt.Errorf("load teardown: %w", err)
	}
	return res, nil
}

// quantile of sorted durations (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
