package harness

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// Target is a running HTTP server under load.
type Target struct {
	Addr  string // host:port on loopback
	Close func() error
}

// ServerFunc starts the owner's HTTP server (the notes resources server on
// the fake provider, checkpointing on, state under dir) on a loopback
// listener. It returns a *SkipError when the server cannot be built here.
type ServerFunc func(ctx context.Context, dir string) (Target, error)

// HTTPRow is one route at one concurrency, against the owner's server and
// against bare fasthttp answering the same bytes.
type HTTPRow struct {
	Route      string
	Clients    int
	ReplyBytes int // body bytes of one iteration's replies
	Server     LoadResult
	Bare       LoadResult
	// BareAfter is the bare handler again, right after the server's run:
	// how far it moved from Bare says whether the machine held still.
	BareAfter LoadResult
	// Load is the 1-minute load average when the cell finished.
	Load string
	// Err is why the cell could not be measured ("" when it was).
	Err string
	// Reruns: the cell was measured again because its first measure was
	// flagged for noise (these are the second's figures).
	Reruns int
}

// BareRPS is bare fasthttp's throughput: the mean of its runs before and
// after the server's (the one before alone when there is no second).
func (r HTTPRow) BareRPS() float64 {
	if r.BareAfter.RPS() == 0 {
		return r.Bare.RPS()
	}
	return (r.Bare.RPS() + r.BareAfter.RPS()) / 2
}

// Ratio is the server's throughput over bare fasthttp's.
func (r HTTPRow) Ratio() float64 {
	if r.BareRPS() == 0 {
		return 0
	}
	return r.Server.RPS() / r.BareRPS()
}

// CPURatio is the ratio were CPU time the only limit, as on a quiet
// machine where server and load generator share the cores: bare's CPU per
// iteration (its server's and its load generator's, the mean of its two
// runs) over the owner's. Unlike Ratio it hardly moves with other work on
// the machine. 0 when a CPU figure is missing.
func (r HTTPRow) CPURatio() float64 {
	bare := func(l LoadResult) time.Duration { return l.ServerCPUPer() + l.ClientCPUPer() }
	b, s := bare(r.Bare), bare(r.Server)
	if r.BareAfter.ServerCPU > 0 && r.BareAfter.ClientCPU > 0 {
		b = (b + bare(r.BareAfter)) / 2
	}
	if r.Bare.ServerCPU == 0 || r.Bare.ClientCPU == 0 || r.Server.ServerCPU == 0 || r.Server.ClientCPU == 0 || s == 0 {
		return 0
	}
	return float64(b) / float64(s)
}

// reply is what the owner's server answered on one route, replayed by the
// bare handler.
type reply struct {
	status      int
	contentType string
	setCookie   []byte
	body        []byte
}

// capture makes one of each request against the server, as a client would,
// and records the replies.
func capture(addr string) (map[string]reply, error) {
	hc := &fasthttp.HostClient{Addr: addr, MaxConns: 1, ReadTimeout: time.Minute, WriteTimeout: time.Minute}
	c := &client{hc: hc, addr: addr, req: fasthttp.AcquireRequest(), resp: fasthttp.AcquireResponse()}
	defer fasthttp.ReleaseRequest(c.req)
	defer fasthttp.ReleaseResponse(c.resp)
	out := map[string]reply{}
	for _, s := range []step{stepSeed, stepAccess, stepAppend, stepClose} {
		if err := c.do(s); err != nil {
			return nil, fmt.Errorf("probe %s: %w", s, err)
		}
		r := reply{
			status:      c.resp.StatusCode(),
			contentType: string(c.resp.Header.ContentType()),
			body:        bytes.Clone(c.resp.Body()),
		}
		for _, raw := range c.resp.Header.Cookies() {
			r.setCookie = bytes.Clone(raw)
		}
		out[s.path()] = r
	}
	return out, nil
}

// startBare serves the captured replies from a bare fasthttp handler: a
// route lookup and a write, nothing else.
func startBare(replies map[string]reply) (Target, error) {
	handler := func(ctx *fasthttp.RequestCtx) {
		r, ok := replies[string(ctx.Path())]
		if !ok {
			ctx.SetStatusCode(fasthttp.StatusNotFound)
			return
		}
		ctx.SetStatusCode(r.status)
		ctx.SetContentType(r.contentType)
		if r.setCookie != nil {
			ctx.Response.Header.SetBytesV(fasthttp.HeaderSetCookie, r.setCookie)
		}
		ctx.SetBody(r.body)
	}
	return serve(handler)
}

// serve runs handler on a fresh loopback listener.
func serve(handler fasthttp.RequestHandler) (Target, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Target{}, fmt.Errorf("listen: %w", err)
	}
	// The settings of package http's server, so that only the handler
	// differs (the Server header has the same length too).
	srv := &fasthttp.Server{Handler: handler, Name: "sandbox-owner", MaxRequestBodySize: 4 << 20, CloseOnShutdown: true}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = srv.Serve(ln)
	}()
	return Target{Addr: ln.Addr().String(), Close: func() error {
		err := srv.Shutdown()
		wg.Wait()
		return err
	}}, nil
}

// http measures every route at every concurrency, adding each row to the
// report as it finishes; an error means the section could not start.
func (h *harness) http(ctx context.Context) error {
	srv, err := h.opts.Server(ctx, h.tmp)
	if err != nil {
		return err
	}
	defer srv.Close()
	replies, err := capture(srv.Addr)
	if err != nil {
		return err
	}
	bare, err := startBare(replies)
	if err != nil {
		return err
	}
	defer bare.Close()

	for _, c := range h.plan.httpClients {
		for _, name := range scenarioNames() {
			if err := ctx.Err(); err != nil {
				return err
			}
			sc, _ := scenarioNamed(name)
			measure := func() HTTPRow {
				row := HTTPRow{Route: name, Clients: c}
				for _, s := range sc.loop {
					row.ReplyBytes += len(replies[s.path()].body)
				}
				// Bare, the server, bare again, back to back, so that both
				// see the same state of this noisy machine and a change of
				// that state during the cell shows. A failed run fails the
				// cell only: the next one runs.
				var err error
				if row.Bare, err = h.load(ctx, bare.Addr, name, c); err == nil {
					if row.Server, err = h.load(ctx, srv.Addr, name, c); err == nil {
						row.BareAfter, err = h.load(ctx, bare.Addr, name, c)
					}
				}
				if err != nil {
					row.Err = oneLine(err.Error())
				}
				row.Load = LoadAverage()
				return row
			}
			row := measure()
			if row.Noisy() {
				// The machine moved under the cell: measure it again;
				// flagged again, it stays so.
				row = measure()
				row.Reruns = 1
			}
			fmt.Fprintf(h.opts.Progress, "http %-16s C=%-4d %8.0f req/s p50 %-8s p99 %-8s | bare %8.0f req/s p50 %-8s p99 %-8s | %.0f%% (errors %d) | CPU/iter server %s bare %s client %s: %.0f%% | load %s %s\n",
				name, c, row.Server.RPS(), fmtDur(row.Server.P50), fmtDur(row.Server.P99),
				row.BareRPS(), fmtDur(row.Bare.P50), fmtDur(row.Bare.P99), row.Ratio()*100, row.Server.Errors,
				fmtDur(row.Server.ServerCPUPer()), fmtDur(row.Bare.ServerCPUPer()), fmtDur(row.Server.ClientCPUPer()), row.CPURatio()*100, row.Load, row.Flag())
			h.update(func(r *Report) { r.HTTP = append(r.HTTP, row) })
		}
	}
	return nil
}

// load runs the load child against addr.
func (h *harness) load(ctx context.Context, addr, scenario string, clients int) (LoadResult, error) {
	var res LoadResult
	err := h.runChild(ctx, &res, "load", "-addr", addr, "-scenario", scenario,
		"-clients", strconv.Itoa(clients), "-duration", h.plan.httpDuration.String(), "-warmup", h.plan.httpWarmup.String())
	if err != nil {
		return res, fmt.Errorf("load %s C=%d on %s: %w", scenario, clients, addr, err)
	}
	if res.Iterations == 0 {
		return res, fmt.Errorf("load %s C=%d on %s: nothing completed (%d errors, first: %s)", scenario, clients, addr, res.Errors, res.FirstError)
	}
	return res, nil
}
