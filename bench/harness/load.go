package harness

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
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
	// ServerCPU is the CPU time the server's process used during the
	// window, and ClientCPU the load generator's own: on a machine other
	// work shares, what each iteration cost is steadier than how many ran.
	// Zero where they could not be read. Iterations counts only those that
	// ended inside the window, so a cost per iteration is a little high
	// at long latencies.
	ServerCPU time.Duration `json:"server_cpu_ns,omitempty"`
	ClientCPU time.Duration `json:"client_cpu_ns,omitempty"`
}

// ServerCPUPer is the server's CPU time per iteration (0 when unknown).
func (l LoadResult) ServerCPUPer() time.Duration { return per(l.ServerCPU, l.Iterations) }

// ClientCPUPer is the load generator's CPU time per iteration.
func (l LoadResult) ClientCPUPer() time.Duration { return per(l.ClientCPU, l.Iterations) }

func per(d time.Duration, n int64) time.Duration {
	if n <= 0 {
		return 0
	}
	return d / time.Duration(n)
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
	// The harness that started this child serves the address.
	res, err := runLoad(addr, sc, clients, warmup, duration, os.Getppid())
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(res)
}

// runLoad drives the clients; serverPID is the process serving addr, whose
// CPU time is read at the window's ends.
func runLoad(addr string, sc scenario, clients int, warmup, duration time.Duration, serverPID int) (LoadResult, error) {
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
	w := newWindow(end)
	lats := make([][]time.Duration, clients)
	errs := make([]int64, clients)
	firsts := make([]error, clients)
	// The CPU times are read at the window's ends, by a goroutine of
	// their own: a client may be mid-request at either instant.
	var cpu cpuWindow
	cpuDone := make(chan struct{})
	go func() {
		defer close(cpuDone)
		time.Sleep(time.Until(measureFrom))
		cpu.start(serverPID)
		time.Sleep(time.Until(end))
		w.reachEnd()
		<-w.done
		cpu.stop(serverPID)
	}()
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				t0 := time.Now()
				if !w.open(t0) {
					return
				}
				if sc.fresh {
					c.cookie = ""
				}
				err := c.run(sc.loop)
				t1 := time.Now()
				if t0.Before(measureFrom) || !w.count(t1) {
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
	<-cpuDone

	var res LoadResult
	res.ServerCPU, res.ClientCPU = cpu.server, cpu.client
	var all []time.Duration
	for i := range cs {
		all = append(all, lats[i]...)
		res.Errors += errs[i]
		if res.FirstError == "" && firsts[i] != nil {
			res.FirstError = firsts[i].Error()
		}
	}
	res.Iterations, res.Window = int64(len(all)), w.closed.Sub(measureFrom)
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

// cpuWindow is the CPU time a server process and this process used between
// start and stop; a figure that could not be read stays zero.
type cpuWindow struct {
	server, client       time.Duration
	server0, client0     time.Duration
	serverOK0, clientOK0 bool
}

func (w *cpuWindow) start(serverPID int) {
	w.server0, w.serverOK0 = procCPU(serverPID)
	w.client0, w.clientOK0 = selfCPU()
}

func (w *cpuWindow) stop(serverPID int) {
	if s, ok := procCPU(serverPID); ok && w.serverOK0 {
		w.server = s - w.server0
	}
	if c, ok := selfCPU(); ok && w.clientOK0 {
		w.client = c - w.client0
	}
}

// selfCPU is this process's user and system CPU time.
func selfCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}

// procCPU is a process's user and system CPU time, all its threads, from
// /proc (Linux; in clock ticks of 10 ms).
func procCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	d, err := parseProcStatCPU(b)
	return d, err == nil
}

// userHZ is the unit of /proc's CPU times: fixed at 100 for user space,
// whatever the kernel's own tick.
const userHZ = 100

// parseProcStatCPU reads utime and stime (fields 14 and 15) of a
// /proc/PID/stat line. The command name (field 2, in parentheses) may hold
// spaces and parentheses, so fields are counted after its last ')'.
func parseProcStatCPU(stat []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("proc stat: no command name")
	}
	f := bytes.Fields(stat[i+1:]) // from field 3 (state) on
	if len(f) < 13 {
		return 0, errors.New("proc stat: too few fields")
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(string(s), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("proc stat: %w", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// window is a load run's measured window. It ends at its planned end, or,
// when no request begun in it has come back by then (a loaded machine, a
// slow route), at the first that does, errors included: a cell always
// measures what it can, over the window it really had, however slow the
// machine, instead of finding nothing to count.
type window struct {
	end      time.Time
	answered atomic.Bool // a request begun in the window came back
	mu       sync.Mutex  // orders the closing
	closed   time.Time   // when the window ended; read after done
	done     chan struct{}
}

func newWindow(end time.Time) *window { return &window{end: end, done: make(chan struct{})} }

// open reports whether a client may begin a request at t: before the
// planned end, and after it while nothing has come back.
func (w *window) open(t time.Time) bool { return t.Before(w.end) || !w.answered.Load() }

// count reports whether a request begun in the window and answered at t1
// counts: it does when it came back by the planned end, or when it is the
// first to come back at all, which then ends the window.
func (w *window) count(t1 time.Time) bool {
	if !t1.After(w.end) {
		w.answered.Store(true)
		return true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.answered.Load() {
		return false
	}
	w.answered.Store(true)
	w.closeAt(t1)
	return true
}

// reachEnd is called at the planned end: the window ends there if a
// request has come back, else at the first that does (count).
func (w *window) reachEnd() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.answered.Load() {
		w.closeAt(w.end)
	}
}

func (w *window) closeAt(t time.Time) {
	if w.closed.IsZero() {
		w.closed = t
		close(w.done)
	}
}
