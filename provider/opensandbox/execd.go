package opensandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime/multipart"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/provider"
)

// endpoint is where a sandbox's execd answers, the headers the lifecycle
// server named for it, and the access token this provider gave it.
type endpoint struct {
	sandbox string
	base    string
	header  map[string]string
	token   string
}

// headers are what every call to the endpoint carries: the token, and the
// headers the lifecycle server named, whose own token wins (a runtime that
// gave execd a token itself, by execd's flag, which wins over the
// environment's).
func (ep endpoint) headers() map[string]string {
	h := map[string]string{}
	if ep.token != "" {
		h[ExecdTokenHeader] = ep.token
	}
	for k, v := range ep.header {
		if http.CanonicalHeaderKey(k) == http.CanonicalHeaderKey(ExecdTokenHeader) {
			delete(h, ExecdTokenHeader)
		}
		h[k] = v
	}
	return h
}

// Endpoint returns the execd endpoint of a sandbox: a URL and the headers
// every call must carry (what lend: direct hands to agents).
func (p *Provider) Endpoint(ctx context.Context, h provider.Handle) (string, map[string]string, error) {
	if err := p.check(h); err != nil {
		return "", nil, err
	}
	ep, err := p.endpoint(ctx, h.SandboxID)
	if err != nil {
		return "", nil, err
	}
	return ep.base, ep.headers(), nil
}

// endpoint resolves (once) GET /sandboxes/{id}/endpoints/44772.
func (p *Provider) endpoint(ctx context.Context, id string) (endpoint, error) {
	p.mu.Lock()
	ep, ok := p.endpoints[id]
	p.mu.Unlock()
	if ok {
		return ep, nil
	}
	q := ""
	if p.opts.UseServerProxy {
		q = "?use_server_proxy=true"
	}
	resp, err := p.api(ctx, "get endpoint", http.MethodGet, fmt.Sprintf("/sandboxes/%s/endpoints/%d%s", url.PathEscape(id), ExecdPort, q), nil, true)
	switch {
	case err != nil:
		return ep, err
	case resp.status == http.StatusNotFound:
		return ep, fmt.Errorf("%w: %w", resp.apiError("get endpoint"), provider.ErrSandboxNotFound)
	case !resp.ok():
		return ep, resp.apiError("get endpoint")
	}
	var doc struct {
		Endpoint string            `json:"endpoint"`
		Headers  map[string]string `json:"headers"`
	}
	if err := json.Unmarshal(resp.body, &doc); err != nil || doc.Endpoint == "" {
		return ep, fmt.Errorf("opensandbox: get endpoint of %s: no endpoint in %s", id, truncate(resp.body))
	}
	// The endpoint has no scheme, and may have a path prefix.
	base := strings.TrimSuffix(doc.Endpoint, "/")
	if !strings.Contains(base, "://") {
		base = p.opts.Protocol + "://" + base
	}
	// The Docker runtime names no headers; another runtime may, and every
	// call carries them.
	if doc.Headers == nil {
		doc.Headers = map[string]string{}
	}
	ep = endpoint{sandbox: id, base: base, header: doc.Headers}
	if ep.token, err = p.tokenOf(ctx, id); err != nil {
		return endpoint{}, err
	}
	p.mu.Lock()
	p.endpoints[id] = ep
	p.mu.Unlock()
	return ep, nil
}

// tokenOf is the execd access token of sandbox id: the one this process
// gave it, else the one its label names ("" for a sandbox made without
// one, whose execd takes none).
func (p *Provider) tokenOf(ctx context.Context, id string) (string, error) {
	p.mu.Lock()
	tok, ok := p.tokens[id]
	p.mu.Unlock()
	if ok {
		return tok, nil
	}
	doc, err := p.getSandbox(ctx, id)
	if err != nil {
		return "", fmt.Errorf("opensandbox: the execd token of %s: %w", id, err)
	}
	tok = decodeLabels(doc.Metadata)[tokenLabel]
	p.mu.Lock()
	p.tokens[id] = tok
	p.mu.Unlock()
	return tok, nil
}

// execdRequest is a request to a sandbox's execd.
func (p *Provider) execdRequest(ep endpoint, op, method, route string) request {
	h := ep.headers()
	if p.opts.UseServerProxy && p.opts.APIKey != "" {
		// The proxy strips the key before execd sees it; a gateway in front
		// of it may want it.
		h[APIKeyHeader] = p.opts.APIKey
	}
	return request{op: op, method: method, url: ep.base + route, header: h, sandbox: ep.sandbox}
}

// execdClient is the client of sandbox id's execd calls. A direct endpoint
// is a host port the runtime may have given to another sandbox since it
// was resolved (a restart ends every container, and the next ones get
// their ports): that other sandbox's execd refuses this one's token, unless
// its agent replaced it with a server of its own, which would take any
// call and answer as it likes. So each sandbox's calls have a transport of
// their own, which connects while none of its connections is open only
// once the lifecycle server says the sandbox has not ended: a sandbox that
// still runs holds its port, and one of its connections still open shows
// that its container is still there (a restart ends them with it), so the
// look is one per spell of calls, not one per connection (a command's
// stream stays open a second after its end, and back-to-back commands each
// take a new connection). A lifecycle server that does not answer fails
// the call closed (see ended). Through the server proxy (which goes by the
// sandbox's id) or a client the options gave, calls share p.http.
func (p *Provider) execdClient(id string) *http.Client {
	if p.execdBase == nil || id == "" {
		return p.http
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.transports[id]
	if !ok {
		t = p.execdBase.Clone()
		dial := (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
		open := new(atomic.Int64)
		t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if open.Load() == 0 {
				if err := p.ended(ctx, id); err != nil {
					// As a connection refused: the call never ran.
					return nil, &net.OpError{Op: "dial", Net: network, Err: err}
				}
			}
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			open.Add(1)
			return &countedConn{Conn: c, open: open}, nil
		}
		p.transports[id] = t
	}
	return &http.Client{Transport: t}
}

// countedConn is a connection counted in open until it is closed.
type countedConn struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}

// waitExecd polls execd's /ping until it answers 200 or the deadline.
func (p *Provider) waitExecd(ctx context.Context, id string, deadline time.Time) error {
	ep, err := p.endpoint(ctx, id)
	if err != nil {
		return fmt.Errorf("opensandbox: execd of %s: %w", id, err)
	}
	poll := p.poller("", deadline)
	for {
		req := p.execdRequest(ep, "ping execd", http.MethodGet, "/ping")
		resp, err := p.once(ctx, req)
		if err == nil && resp.status == http.StatusOK {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !p.clk.Now().Before(deadline) {
			if err == nil {
				err = resp.apiError("ping execd")
			}
			return fmt.Errorf("opensandbox: execd of sandbox %s did not answer by the ready deadline: %w", id, err)
		}
		if err := poll.wait(ctx); err != nil {
			return err
		}
	}
}

// gone turns a failed execd call into ErrSandboxNotFound when the sandbox no
// longer exists (a proxy or a closed connection says little on its own).
func (p *Provider) gone(ctx context.Context, id string, err error) error {
	if errors.Is(err, provider.ErrUnavailable) {
		return err // the lifecycle server just gave no answer about it
	}
	p.mu.Lock()
	delete(p.endpoints, id) // re-resolve next time
	p.mu.Unlock()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.opts.RequestTimeout)
	defer cancel()
	if _, gerr := p.getSandbox(cctx, id); errors.Is(gerr, provider.ErrSandboxNotFound) {
		p.forget(id)
		return fmt.Errorf("%w (%w)", gerr, err)
	}
	return err
}

// resolve makes name absolute inside the sandbox.
func resolve(workdir, name string) string {
	if path.IsAbs(name) {
		return path.Clean(name)
	}
	return path.Join(workdir, name)
}

// event is one frame of the command stream.
type event struct {
	Type  string `json:"type"`
	Text  string `json:"text"`
	Error *struct {
		EName     string   `json:"ename"`
		EValue    string   `json:"evalue"`
		Traceback []string `json:"traceback"`
	} `json:"error"`
}

// capped keeps the first max bytes written.
type capped struct {
	buf       bytes.Buffer
	max       int
	truncated bool
}

func (c *capped) add(s string) {
	if room := c.max - c.buf.Len(); len(s) > room {
		s = s[:max(room, 0)]
		c.truncated = true
	}
	c.buf.WriteString(s)
}

// line adds one line of output as execd sends it. execd reads a command's
// output a line at a time and sends each line without its ending: a line
// ended by "\n", "\r" or "\r\n" and a last line that has no ending at all
// arrive alike, and an empty line arrives as the text "\n". So every line is
// given back a "\n": what a command printed comes back byte for byte except
// that "\r" and "\r\n" become "\n" and a last line without a newline gains
// one. Nothing on the wire tells those cases apart.
func (c *capped) line(text string) {
	if text != "\n" {
		c.add(text)
	}
	c.add("\n")
}

// errNoFinalEvent: the stream ended before the command's last event.
var errNoFinalEvent = errors.New("opensandbox: the command stream ended without a final event")

// signals maps the names Go gives signals ("terminated", "killed") to their
// numbers: execd reports a command killed by a signal with evalue -1 and the
// name in its traceback ("signal: terminated").
var signals = func() map[string]int {
	m := map[string]int{}
	for n := 1; n < 65; n++ {
		m[syscall.Signal(n).String()] = n
	}
	return m
}()

// streamHooks are what parseStream tells its caller as it reads.
type streamHooks struct {
	// init receives the command's id, which interrupts it.
	init func(id string)
	// timedOut reports, when the command was killed, whether its timeout
	// had passed: execd reports a timeout and any other killing signal
	// alike, so the deadline is what tells them apart.
	timedOut func() bool
}

// parseStream reads execd's command stream up to its final event: JSON
// frames each on a line and followed by a blank line, without SSE's "data:"
// prefix (which is accepted too, as are SSE comment and field lines).
func parseStream(r io.Reader, outCap int, hooks streamHooks) (provider.ExecResult, error) {
	return parseFrames(r, outCap, maxFrame, hooks)
}

// parseFrames is parseStream with frames bounded at frameCap bytes.
func parseFrames(r io.Reader, outCap, frameCap int, hooks streamHooks) (provider.ExecResult, error) {
	stdout, stderr := &capped{max: outCap}, &capped{max: outCap}
	result := func(code int) provider.ExecResult {
		return provider.ExecResult{Stdout: stdout.buf.String(), Stderr: stderr.buf.String(), ExitCode: code,
			Truncated: stdout.truncated || stderr.truncated}
	}
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, cut, err := readLine(br, frameCap)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return provider.ExecResult{}, errNoFinalEvent
			}
			return provider.ExecResult{}, fmt.Errorf("opensandbox: read the command stream: %w", err)
		}
		line = bytes.TrimSpace(line)
		if rest, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			line = bytes.TrimSpace(rest)
		}
		if len(line) == 0 || line[0] != '{' {
			continue // blank separator, SSE comment, event:/id: lines
		}
		if full(line, `{"type":"stdout"`, stdout) || full(line, `{"type":"stderr"`, stderr) {
			// Output past the cap: nothing of it is kept, so it is not
			// decoded either (a command may print gigabytes).
			continue
		}
		if cut {
			// One line of output longer than a frame may be: keep what
			// fits of its text, and say that output was cut.
			if out, text, ok := partialLine(line, stdout, stderr); ok {
				out.add(text)
				out.add("\n")
				out.truncated = true
			}
			continue
		}
		var ev event
		if err := json.Unmarshal(line, &ev); err != nil {
			return provider.ExecResult{}, fmt.Errorf("opensandbox: bad frame in the command stream: %w", err)
		}
		switch ev.Type {
		case "init":
			if hooks.init != nil && ev.Text != "" {
				hooks.init(ev.Text)
			}
		case "stdout":
			stdout.line(ev.Text)
		case "stderr":
			stderr.line(ev.Text)
		case "execution_complete":
			return result(0), nil
		case "error":
			return finalError(ev, result, hooks.timedOut)
		}
		// ping, status and anything newer: nothing to keep.
	}
}

// finalError turns the stream's final error event into the result.
func finalError(ev event, result func(int) provider.ExecResult, timedOut func() bool) (provider.ExecResult, error) {
	if ev.Error == nil {
		return provider.ExecResult{}, fmt.Errorf("opensandbox: the command failed without details")
	}
	code, cerr := strconv.Atoi(strings.TrimSpace(ev.Error.EValue))
	if cerr != nil {
		return provider.ExecResult{}, fmt.Errorf("opensandbox: the command could not run: %s: %s", ev.Error.EName, ev.Error.EValue)
	}
	res := result(code)
	if code != -1 {
		return res, nil
	}
	if timedOut != nil && timedOut() {
		// execd kills the group at the timeout; report it as the local
		// provider does (SIGKILL).
		res.TimedOut, res.ExitCode = true, 128+int(syscall.SIGKILL)
		return res, nil
	}
	// Killed by a signal before any deadline: 128+N, as a shell reports it.
	for _, tb := range ev.Error.Traceback {
		if n, ok := signals[strings.TrimPrefix(tb, "signal: ")]; ok {
			res.ExitCode = 128 + n
			break
		}
	}
	return res, nil
}

// full reports that frame is output for out and out has no room left.
func full(frame []byte, prefix string, out *capped) bool {
	return out.truncated && bytes.HasPrefix(frame, []byte(prefix))
}

// partialLine picks the output a cut frame belongs to and the text of it
// that survived, from the start of the frame: execd writes "type" first and
// "text" second.
func partialLine(frame []byte, stdout, stderr *capped) (*capped, string, bool) {
	var out *capped
	rest, ok := bytes.CutPrefix(frame, []byte(`{"type":"stdout","text":"`))
	if ok {
		out = stdout
	} else if rest, ok = bytes.CutPrefix(frame, []byte(`{"type":"stderr","text":"`)); ok {
		out = stderr
	} else {
		return nil, "", false
	}
	// Only what fits is kept: an escape is at most six bytes for one byte
	// of text, so a prefix of 6·room bytes, and the few a cut may drop or
	// spoil at its end, decodes to all of it, without scanning a 16 MiB
	// frame over and over.
	if keep := 6*max(out.max-out.buf.Len(), 0) + 24; len(rest) > keep {
		rest = rest[:keep]
	}
	// The cut may fall inside an escape (at most \uXXXX\uXXXX): drop bytes
	// until what is left is a whole JSON string.
	for drop := 0; drop <= 12 && drop <= len(rest); drop++ {
		var s string
		if json.Unmarshal(append(append([]byte{'"'}, rest[:len(rest)-drop]...), '"'), &s) == nil {
			return out, s, true
		}
	}
	return out, "", true
}

// readLine reads one line, keeping at most frameCap bytes of it; cut says
// that the rest was read and dropped.
func readLine(br *bufio.Reader, frameCap int) (line []byte, cut bool, err error) {
	for {
		chunk, isPrefix, err := br.ReadLine()
		if err != nil {
			return nil, false, err
		}
		if room := frameCap - len(line); len(chunk) > room {
			chunk, cut = chunk[:max(room, 0)], true
		}
		line = append(line, chunk...)
		if !isPrefix {
			return line, cut, nil
		}
	}
}

// drainTimeout bounds how long a command stream is read after its caller
// has its answer or has gone: execd holds a stream open about a second
// after its final event, and an interrupted command gets a few seconds to
// end on SIGTERM before SIGKILL.
const drainTimeout = 30 * time.Second

// literal refuses a path execd would rewrite: it expands $NAME, ${NAME} and
// $ followed by a shell's special character in every path and cwd it is
// given, and has no escape for a dollar sign. A $ before anything else (a
// dot, a space, the end) is left alone, and so passes.
func literal(what, name string) error {
	if os.Expand(name, func(string) string { return "\x00" }) != name {
		return fmt.Errorf("opensandbox: %s %q: OpenSandbox's execd would expand the $ in it, and has no way to escape one: %w", what, name, provider.ErrInvalidSpec)
	}
	return nil
}

// streamOutcome is how a command stream ended; id is the command's, when
// its init event came.
type streamOutcome struct {
	res provider.ExecResult
	err error
	id  string
}

// Exec runs one command through execd's POST /command. A command is sent
// once and never again: it may have run even when its answer was lost. The
// one exception is a command refused before it ran (a 401 or 403, or no
// connection: see refusedUnrun), which goes once more to the sandbox's
// endpoint resolved again, when that moved.
//
// The stream is never dropped while execd may still write to it: execd
// passes every signal it receives to every running command, and the SIGPIPE
// of writing to a dropped connection would kill commands of other callers.
// So the answer returns at the final event and the rest of the stream (the
// second execd waits before closing it) is read in the background; a caller
// that goes away first has its command interrupted through execd
// (DELETE /command?id=), and the stream is read until the command has ended.
func (p *Provider) Exec(ctx context.Context, h provider.Handle, req provider.ExecRequest) (provider.ExecResult, error) {
	if err := p.check(h); err != nil {
		return provider.ExecResult{}, err
	}
	id := h.SandboxID
	workdir := workdirOf(h, p.opts.Workdir)
	cwd := workdir
	if req.Cwd != "" {
		cwd = resolve(workdir, req.Cwd)
	}
	if err := literal("cwd", cwd); err != nil {
		return provider.ExecResult{}, err
	}
	ep, err := p.endpoint(ctx, id)
	if err != nil {
		return provider.ExecResult{}, err
	}
	body := map[string]any{"command": req.Command, "cwd": cwd}
	if len(req.Env) > 0 {
		body["envs"] = req.Env
	}
	// Without a timeout of its own, the call is bounded by the caller.
	callTimeout := 24 * time.Hour
	if req.Timeout > 0 {
		body["timeout"] = req.Timeout.Milliseconds()
		callTimeout = req.Timeout + time.Minute
	}
	b, _ := json.Marshal(body)
	bound := p.clk.Now().Add(callTimeout)
	o, ok := p.runCommand(ctx, ep, b, req.Timeout, callTimeout)
	if ok && refusedUnrun(o.err) {
		// Not this sandbox's execd, or none: the command never ran, so it
		// is sent once more where the sandbox is now, if that moved.
		if nep, moved := p.reresolve(ctx, id, ep); moved {
			ep = nep
			o, ok = p.runCommand(ctx, nep, b, req.Timeout, callTimeout)
		}
	}
	if !ok {
		return provider.ExecResult{}, fmt.Errorf("opensandbox: run command: %w", ctx.Err())
	}
	if errors.Is(o.err, errNoFinalEvent) {
		return provider.ExecResult{}, p.settle(ctx, ep, o.id, bound)
	}
	return p.execOutcome(ctx, id, o)
}

// probe runs one of the provider's own commands, which are idempotent: one
// whose stream ended without its final event (see settle) has ended by the
// time settle answers, and is run once more.
func (p *Provider) probe(ctx context.Context, h provider.Handle, req provider.ExecRequest) (provider.ExecResult, error) {
	res, err := p.Exec(ctx, h, req)
	if errors.Is(err, errNoFinalEvent) && ctx.Err() == nil {
		p.log.WithError(err).WithField("sandbox_id", h.SandboxID).Info("opensandbox: a probe's stream was cut; running it again")
		res, err = p.Exec(ctx, h, req)
	}
	return res, err
}

// commandStatus is execd's GET /command/status/{id}.
type commandStatus struct {
	Running  bool   `json:"running"`
	ExitCode *int   `json:"exit_code"`
	Error    string `json:"error"`
}

// settle answers a command whose stream ended cleanly without its final
// event. execd writes no event once it takes the request's context for
// done, and still runs the command to its end and ends the stream as usual;
// so the stream's events are a prefix of the command's, and how much of its
// output is missing cannot be told. execd keeps no output of a foreground
// command that a client can read (GET /command/{id}/logs refuses one that
// is not a background command), only its status. So the command is waited
// for, through its status, until it ends or bound passes (it is never sent
// again: it ran), and the answer is an error wrapping
// provider.ErrUnavailable (a 503 to callers) and provider.ErrOutcomeLost
// (so that a caller can say it may have run) that names how it ended. A
// caller that goes away meanwhile has the command interrupted, as Exec
// does. Without the command's id (its init event was lost too) nothing can
// be asked about it.
func (p *Provider) settle(ctx context.Context, ep endpoint, cmd string, bound time.Time) error {
	if cmd == "" {
		return fmt.Errorf("opensandbox: run command: %w, before its init event: whether the command ran is unknown, and it is not sent again: %w (%w)", errNoFinalEvent, provider.ErrUnavailable, provider.ErrOutcomeLost)
	}
	st, err := p.awaitCommand(ctx, ep, cmd, bound)
	if ctx.Err() != nil || err == nil && st.Running {
		p.background.Add(1)
		go func() {
			defer p.background.Done()
			p.interrupt(ep, cmd)
		}()
	}
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("opensandbox: run command: %w", ctx.Err())
	case err != nil:
		if gerr := p.gone(ctx, ep.sandbox, err); errors.Is(gerr, provider.ErrSandboxNotFound) {
			return fmt.Errorf("opensandbox: run command: %w: %w", errNoFinalEvent, gerr)
		}
		return fmt.Errorf("opensandbox: run command: %w, and the status of command %s is unknown: %v: %w (%w)", errNoFinalEvent, cmd, err, provider.ErrUnavailable, provider.ErrOutcomeLost)
	case st.Running:
		return fmt.Errorf("opensandbox: run command: %w, and command %s still ran at the call's bound (it is interrupted): %w (%w)", errNoFinalEvent, cmd, provider.ErrUnavailable, provider.ErrOutcomeLost)
	}
	how := "without an exit code"
	if st.ExitCode != nil {
		how = "with exit code " + strconv.Itoa(*st.ExitCode)
	}
	if st.Error != "" {
		how += " (" + st.Error + ")"
	}
	return fmt.Errorf("opensandbox: run command: %w: command %s ended %s, and execd keeps none of its output to read: %w (%w)", errNoFinalEvent, cmd, how, provider.ErrUnavailable, provider.ErrOutcomeLost)
}

// awaitCommand polls execd's status of command cmd until it has ended, bound
// passes (the last status, still running) or ctx ends.
func (p *Provider) awaitCommand(ctx context.Context, ep endpoint, cmd string, bound time.Time) (commandStatus, error) {
	poll := p.poller("", bound)
	for {
		req := p.execdRequest(ep, "command status", http.MethodGet, "/command/status/"+url.PathEscape(cmd))
		req.retry = true
		resp, err := p.do(ctx, req)
		if err != nil {
			return commandStatus{}, err
		}
		if !resp.ok() {
			return commandStatus{}, resp.apiError("command status")
		}
		var st commandStatus
		if err := json.Unmarshal(resp.body, &st); err != nil {
			return commandStatus{}, fmt.Errorf("opensandbox: command status: %w", err)
		}
		if !st.Running || !p.clk.Now().Before(bound) {
			return st, nil
		}
		if err := poll.wait(ctx); err != nil {
			return st, err
		}
	}
}

// runCommand sends a command to the execd at ep and returns how its stream
// ended; ok is false when ctx ended first (the command is then interrupted
// in the background).
func (p *Provider) runCommand(ctx context.Context, ep endpoint, body []byte, timeout, callTimeout time.Duration) (streamOutcome, bool) {
	r := p.execdRequest(ep, "run command", http.MethodPost, "/command")
	// The stream's own context outlives ctx (see Exec); callTimeout and
	// drainTimeout bound it.
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout+drainTimeout)
	hr, err := http.NewRequestWithContext(sctx, r.method, r.url, bytes.NewReader(body))
	if err != nil {
		scancel()
		return streamOutcome{err: err}, true
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Accept", "text/event-stream")
	for k, v := range r.header {
		hr.Header.Set(k, v)
	}
	start := p.clk.Now()
	ids := make(chan string, 1)
	done := make(chan streamOutcome, 1)
	var cmdID string // the stream's goroutine's own
	hooks := streamHooks{
		init: func(cmd string) {
			cmdID = cmd
			select {
			case ids <- cmd:
			default:
			}
		},
		timedOut: func() bool { return timeout > 0 && !p.clk.Now().Before(start.Add(timeout)) },
	}
	p.background.Add(1)
	go func() {
		defer p.background.Done()
		defer scancel()
		res, err := p.execdClient(ep.sandbox).Do(hr)
		if err != nil {
			done <- streamOutcome{err: err}
			return
		}
		defer res.Body.Close()
		if res.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
			done <- streamOutcome{err: commandRefused(&response{status: res.StatusCode, header: res.Header, body: b})}
			return
		}
		out, err := parseFrames(res.Body, p.opts.OutputCap, p.frameCap, hooks)
		done <- streamOutcome{res: out, err: err, id: cmdID}
		if err == nil {
			// Read to the end, so that the connection closes on execd's
			// side first (and goes back to the pool).
			stop := time.AfterFunc(drainTimeout, scancel)
			_, _ = io.Copy(io.Discard, res.Body)
			stop.Stop()
		}
	}()
	select {
	case o := <-done:
		return o, true
	case <-ctx.Done():
	}
	select {
	case o := <-done: // it ended as the caller went
		return o, true
	default:
	}
	p.background.Add(1)
	go func() {
		defer p.background.Done()
		p.interruptCommand(ep, ids, done, scancel)
	}()
	return streamOutcome{}, false
}

// ended asks the lifecycle server whether sandbox id has ended, before a
// new connection to its execd: nil when it says it has not, an error
// wrapping provider.ErrSandboxNotFound when it has. Without its answer the
// connection is not made (an error wrapping provider.ErrUnavailable, which
// callers answer as a retryable 503): a server that does not answer is
// likeliest just after its runtime restarted, which is when an ended
// sandbox's port may lead to another sandbox's execd, one its agent may
// have replaced with a server of its own. The look is retried as any
// lifecycle call is (once only while the server is known unreachable),
// within the bound of one request.
func (p *Provider) ended(ctx context.Context, id string) error {
	// The dial's context is not the caller's: the transport lets a dial go
	// on after its request went, for the next one.
	ctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	resp, err := p.api(ctx, "get sandbox", http.MethodGet, "/sandboxes/"+url.PathEscape(id), nil, true)
	if err == nil {
		_, err = readSandbox(id, resp)
		if err == nil {
			return nil
		}
		if errors.Is(err, provider.ErrSandboxNotFound) {
			return fmt.Errorf("the port of ended sandbox %s is not its own any more: %w", id, err)
		}
	}
	return fmt.Errorf("the lifecycle server did not say whether sandbox %s has ended, so its execd is not connected to: %w (%w)", id, err, provider.ErrUnavailable)
}

// lookRefused reports an execd call that the look before its connection
// refused (see ended): its sandbox ended, or the lifecycle server did not
// say. The look was retried already; the call is not made again, at the
// same endpoint or another.
func lookRefused(err error) bool {
	return errors.Is(err, provider.ErrSandboxNotFound) || errors.Is(err, provider.ErrUnavailable)
}

// refusedUnrun reports an execd call that did not run, because what
// answered at the endpoint is not the sandbox's execd (401 or 403: another
// execd's token check, a gateway's refusal) or nothing answered at all (no
// connection was made): the endpoint may have moved. One not made because
// its sandbox ended (see execdClient) is not.
func refusedUnrun(err error) bool {
	if lookRefused(err) {
		return false // refused before it connected: it has moved nowhere
	}
	var refused *refusal
	if errors.As(err, &refused) {
		return refused.status == http.StatusUnauthorized || refused.status == http.StatusForbidden
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// reresolve drops sandbox id's cached endpoint, when it is still old, and
// resolves it again; moved says whether it now leads elsewhere (only then
// is a call worth making again). A failure to resolve is not moved: the
// caller's own error path looks at the sandbox.
func (p *Provider) reresolve(ctx context.Context, id string, old endpoint) (endpoint, bool) {
	p.mu.Lock()
	if cur, ok := p.endpoints[id]; ok && cur.base == old.base {
		delete(p.endpoints, id)
	}
	p.mu.Unlock()
	ep, err := p.endpoint(ctx, id)
	if err != nil {
		return old, false
	}
	moved := ep.base != old.base
	if moved {
		logs.ForRequest(ctx, p.log).WithFields(logrus.Fields{"sandbox_id": id, "from": old.base, "to": ep.base}).
			Info("opensandbox: the sandbox's execd endpoint moved (another execd or none answered there)")
	}
	return ep, moved
}

// execOutcome turns how a stream ended into Exec's answer.
func (p *Provider) execOutcome(ctx context.Context, id string, o streamOutcome) (provider.ExecResult, error) {
	var refused *refusal
	switch {
	case o.err == nil:
		return o.res, nil
	case errors.As(o.err, &refused):
		if refused.final {
			return provider.ExecResult{}, o.err
		}
		return provider.ExecResult{}, p.gone(ctx, id, o.err)
	case ctx.Err() != nil:
		return provider.ExecResult{}, fmt.Errorf("opensandbox: run command: %w", ctx.Err())
	}
	return provider.ExecResult{}, p.gone(ctx, id, fmt.Errorf("opensandbox: run command: %w", o.err))
}

// interruptCommand ends the command of a caller that went away: it waits
// for the command's id (the stream's first event), asks execd to interrupt
// the command (SIGTERM to its process group, SIGKILL a few seconds later),
// and lets the stream run to its end, as far as drainTimeout.
func (p *Provider) interruptCommand(ep endpoint, ids <-chan string, done <-chan streamOutcome, scancel context.CancelFunc) {
	bound := time.NewTimer(drainTimeout)
	defer bound.Stop()
	defer scancel()
	select {
	case cmd := <-ids:
		p.interrupt(ep, cmd)
	case <-done:
		return
	case <-bound.C:
		return
	}
	select {
	case <-done:
	case <-bound.C:
	}
}

// interrupt asks execd to interrupt command cmd.
func (p *Provider) interrupt(ep endpoint, cmd string) {
	ctx, cancel := context.WithTimeout(context.Background(), p.opts.RequestTimeout)
	defer cancel()
	req := p.execdRequest(ep, "interrupt command", http.MethodDelete, "/command?"+url.Values{"id": {cmd}}.Encode())
	if resp, err := p.once(ctx, req); err != nil || !resp.ok() {
		// It may have ended meanwhile (execd then answers 500).
		p.log.WithError(err).WithField("command", cmd).Debug("opensandbox: interrupt command")
	}
}

// refusal is execd's non-200 answer to POST /command; final ones mean the
// request is wrong and are not a sign that the sandbox is gone.
type refusal struct {
	err    error
	status int
	final  bool
}

func (r *refusal) Error() string { return r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

// commandRefused reads execd's refusal of a command. A 400 is the request's
// fault: a cwd that does not exist or is not a directory (execd checks it
// before it runs anything), or another invalid field.
func commandRefused(resp *response) error {
	aerr := resp.apiError("run command")
	if resp.status != http.StatusBadRequest {
		return &refusal{err: aerr, status: resp.status}
	}
	var cause error = provider.ErrInvalidSpec
	switch {
	case strings.Contains(aerr.Message, "working directory does not exist"):
		cause = fs.ErrNotExist
	case strings.Contains(aerr.Message, "not a directory"):
		cause = syscall.ENOTDIR
	}
	return &refusal{err: fmt.Errorf("%w: %w", aerr, cause), status: resp.status, final: true}
}

// errnos are the system errors execd's file calls name in the message of a
// 500 RUNTIME_ERROR, by the text Go gives them. A 500 from execd is its
// answer about the path (a path under a regular file, in /proc, a
// directory), not a failure to retry.
var errnos = []syscall.Errno{syscall.ENOTDIR, syscall.EISDIR, syscall.ENOENT, syscall.ENAMETOOLONG, syscall.EACCES, syscall.EPERM, syscall.EROFS, syscall.ENOSPC}

// fileError turns execd's failed answer about a file call on full into an
// error: a missing path wraps fs.ErrNotExist, a named system error wraps
// that error, anything else is the *APIError.
func fileError(resp *response, op, full string) error {
	aerr := resp.apiError(op)
	switch {
	case resp.status == http.StatusNotFound:
		return fmt.Errorf("%w: %w", aerr, &fs.PathError{Op: op, Path: full, Err: fs.ErrNotExist})
	case resp.status == http.StatusBadRequest:
		return fmt.Errorf("%w: %w", aerr, provider.ErrInvalidSpec)
	}
	for _, e := range errnos {
		if strings.Contains(aerr.Message, e.Error()) {
			return fmt.Errorf("%w: %w", aerr, &fs.PathError{Op: op, Path: full, Err: e})
		}
	}
	if strings.Contains(aerr.Message, "seeker can't seek") {
		// http.ServeContent's answer for what has no size (/proc, a FIFO).
		return fmt.Errorf("%w: %s is not a regular file: %w", aerr, full, provider.ErrInvalidSpec)
	}
	return aerr
}

// fileCall makes a files request for sandbox id, mk building it for the
// endpoint ep. execd's own 500 is its answer (see errnos), so it is taken as
// it is; only a failure to get an answer, or a proxy's, is tried again. A
// download of a directory gets a 200 whose body never comes, or a 500,
// depending on the file system: before trying again, dir (when set) is
// asked about the path. An answer that says the endpoint is not (or no
// longer) the sandbox's execd, a 401 or 403 or no answer at all, drops the
// cached endpoint and resolves it again; when it moved, the call goes there
// (file calls may be made twice: a write writes the same bytes). One that
// the look before its connection refused is not tried again (lookRefused).
func (p *Provider) fileCall(ctx context.Context, id string, ep endpoint, mk func(endpoint) request, dir func(context.Context, endpoint) bool) (*response, error) {
	req := mk(ep)
	resp, err := p.once(ctx, req)
	if err != nil && ctx.Err() == nil && !lookRefused(err) || err == nil && (resp.status == http.StatusUnauthorized || resp.status == http.StatusForbidden) {
		if nep, moved := p.reresolve(ctx, id, ep); moved {
			ep, req = nep, mk(nep)
			resp, err = p.once(ctx, req)
		}
	}
	if lookRefused(err) {
		return nil, err
	}
	if err == nil && (resp.status == http.StatusInternalServerError || !retryableStatus(resp.status)) {
		if resp.status == http.StatusInternalServerError && dir != nil && dir(ctx, ep) {
			return nil, syscall.EISDIR
		}
		return resp, nil
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("opensandbox: %s: %w", req.op, ctx.Err())
	}
	if dir != nil && dir(ctx, ep) {
		return nil, syscall.EISDIR
	}
	return p.do(ctx, req)
}

// isDir asks execd's /files/info whether full is a directory.
func (p *Provider) isDir(ctx context.Context, ep endpoint, full string) bool {
	req := p.execdRequest(ep, "file info", http.MethodGet, "/files/info?"+url.Values{"path": {full}}.Encode())
	resp, err := p.once(ctx, req)
	if err != nil || !resp.ok() {
		return false
	}
	var info map[string]struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(resp.body, &info) == nil && info[full].Type == "directory"
}

// upload writes files (absolute path → data) in one multipart request of
// metadata/file pairs.
func (p *Provider) upload(ctx context.Context, h provider.Handle, files map[string][]byte) error {
	for name := range files {
		if err := literal("path", name); err != nil {
			return err
		}
	}
	ep, err := p.endpoint(ctx, h.SandboxID)
	if err != nil {
		return err
	}
	// The body is built once at its size (the parts' data and a few hundred
	// bytes of headers each), not grown by doubling: files may be large.
	size := 0
	for _, data := range files {
		size += len(data) + 512
	}
	buf := bytes.NewBuffer(make([]byte, 0, size+64))
	mw := multipart.NewWriter(buf)
	for name, data := range files {
		meta, _ := json.Marshal(map[string]any{"path": name, "mode": 644})
		// execd reads the metadata from a file part.
		mh := textproto.MIMEHeader{}
		mh.Set("Content-Disposition", `form-data; name="metadata"; filename="metadata.json"`)
		mh.Set("Content-Type", "application/json")
		part, err := mw.CreatePart(mh)
		if err != nil {
			return err
		}
		_, _ = part.Write(meta)
		fh := textproto.MIMEHeader{}
		fh.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename=%q`, path.Base(name)))
		fh.Set("Content-Type", "application/octet-stream")
		if part, err = mw.CreatePart(fh); err != nil {
			return err
		}
		_, _ = part.Write(data)
	}
	if err := mw.Close(); err != nil {
		return err
	}
	mk := func(ep endpoint) request {
		req := p.execdRequest(ep, "upload files", http.MethodPost, "/files/upload")
		req.body, req.contentType, req.retry = buf.Bytes(), mw.FormDataContentType(), true
		return req
	}
	resp, err := p.fileCall(ctx, h.SandboxID, ep, mk, nil)
	if err != nil {
		return p.gone(ctx, h.SandboxID, err)
	}
	if !resp.ok() {
		full := ""
		if len(files) == 1 {
			for full = range files {
			}
		}
		return p.notGone(ctx, h.SandboxID, fileError(resp, "write", full))
	}
	return nil
}

// notGone returns err, unless it says nothing of the path (a proxy's
// answer, a 404 that may be the sandbox's) and the sandbox is gone.
func (p *Provider) notGone(ctx context.Context, id string, err error) error {
	var perr *fs.PathError
	if errors.As(err, &perr) && !errors.Is(err, fs.ErrNotExist) || errors.Is(err, provider.ErrInvalidSpec) {
		return err
	}
	if gerr := p.gone(ctx, id, err); errors.Is(gerr, provider.ErrSandboxNotFound) {
		return gerr
	}
	return err
}

// WriteFile writes a file through execd's /files/upload.
func (p *Provider) WriteFile(ctx context.Context, h provider.Handle, name string, data []byte) error {
	if err := p.check(h); err != nil {
		return err
	}
	if name == "" {
		return fmt.Errorf("opensandbox: write_file: empty path: %w", provider.ErrInvalidSpec)
	}
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout())
	defer cancel()
	return p.upload(ctx, h, map[string][]byte{resolve(workdirOf(h, p.opts.Workdir), name): data})
}

// ReadFile reads a file through execd's /files/download; a missing file
// wraps fs.ErrNotExist, a directory syscall.EISDIR, a missing sandbox
// provider.ErrSandboxNotFound.
func (p *Provider) ReadFile(ctx context.Context, h provider.Handle, name string) ([]byte, error) {
	if err := p.check(h); err != nil {
		return nil, err
	}
	if name == "" {
		return nil, fmt.Errorf("opensandbox: read_file: empty path: %w", provider.ErrInvalidSpec)
	}
	full := resolve(workdirOf(h, p.opts.Workdir), name)
	if err := literal("path", full); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout())
	defer cancel()
	ep, err := p.endpoint(ctx, h.SandboxID)
	if err != nil {
		return nil, err
	}
	mk := func(ep endpoint) request {
		req := p.execdRequest(ep, "download file", http.MethodGet, "/files/download?"+url.Values{"path": {full}}.Encode())
		req.retry = true
		return req
	}
	resp, err := p.fileCall(ctx, h.SandboxID, ep, mk, func(ctx context.Context, ep endpoint) bool { return p.isDir(ctx, ep, full) })
	if errors.Is(err, syscall.EISDIR) {
		return nil, fmt.Errorf("opensandbox: read_file: %w", &fs.PathError{Op: "read", Path: full, Err: syscall.EISDIR})
	}
	if err != nil {
		return nil, p.gone(ctx, h.SandboxID, err)
	}
	if resp.ok() {
		return resp.body, nil
	}
	return nil, p.notGone(ctx, h.SandboxID, fmt.Errorf("opensandbox: read_file: %w", fileError(resp, "read", full)))
}
