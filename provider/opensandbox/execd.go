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
	"maps"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxowner/owner/provider"
)

// endpoint is where a sandbox's execd answers, and the headers it wants.
type endpoint struct {
	base   string
	header map[string]string
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
	return ep.base, maps.Clone(ep.header), nil
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
	ep = endpoint{base: base, header: doc.Headers}
	p.mu.Lock()
	p.endpoints[id] = ep
	p.mu.Unlock()
	return ep, nil
}

// execdRequest is a request to a sandbox's execd.
func (p *Provider) execdRequest(ep endpoint, op, method, route string) request {
	h := maps.Clone(ep.header)
	if h == nil {
		h = map[string]string{}
	}
	if p.opts.UseServerProxy && p.opts.APIKey != "" {
		// The proxy strips the key before execd sees it; a gateway in front
		// of it may want it.
		h[APIKeyHeader] = p.opts.APIKey
	}
	return request{op: op, method: method, url: ep.base + route, header: h}
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
		EName  string `json:"ename"`
		EValue string `json:"evalue"`
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

// errNoFinalEvent: the stream ended before the command's last event.
var errNoFinalEvent = errors.New("opensandbox: the command stream ended without a final event")

// parseStream reads execd's command stream: JSON frames each on a line and
// followed by a blank line, without SSE's "data:" prefix (which is accepted
// too, as are SSE comment and field lines).
func parseStream(r io.Reader, outCap int, timeout time.Duration) (provider.ExecResult, error) {
	stdout, stderr := &capped{max: outCap}, &capped{max: outCap}
	result := func(code int) provider.ExecResult {
		return provider.ExecResult{Stdout: stdout.buf.String(), Stderr: stderr.buf.String(), ExitCode: code,
			Truncated: stdout.truncated || stderr.truncated}
	}
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := readLine(br)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return result(-1), errNoFinalEvent
			}
			return result(-1), fmt.Errorf("opensandbox: read the command stream: %w", err)
		}
		line = bytes.TrimSpace(line)
		if rest, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			line = bytes.TrimSpace(rest)
		}
		if len(line) == 0 || line[0] != '{' {
			continue // blank separator, SSE comment, event:/id: lines
		}
		var ev event
		if err := json.Unmarshal(line, &ev); err != nil {
			return result(-1), fmt.Errorf("opensandbox: bad frame in the command stream: %w", err)
		}
		switch ev.Type {
		case "stdout":
			stdout.add(ev.Text)
		case "stderr":
			stderr.add(ev.Text)
		case "execution_complete":
			return result(0), nil
		case "error":
			if ev.Error == nil {
				return result(-1), fmt.Errorf("opensandbox: the command failed without details")
			}
			code, cerr := strconv.Atoi(strings.TrimSpace(ev.Error.EValue))
			if cerr != nil {
				return result(-1), fmt.Errorf("opensandbox: the command could not run: %s: %s", ev.Error.EName, ev.Error.EValue)
			}
			res := result(code)
			if code == -1 && timeout > 0 {
				// execd kills the group at the timeout and reports -1;
				// report it as the local provider does (SIGKILL).
				res.TimedOut, res.ExitCode = true, 137
			}
			return res, nil
		}
		// init, ping, status and anything newer: nothing to keep.
	}
}

// readLine reads one line of at most maxFrame bytes.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, isPrefix, err := br.ReadLine()
		if err != nil {
			return nil, err
		}
		line = append(line, chunk...)
		if len(line) > maxFrame {
			return nil, fmt.Errorf("a frame longer than %d bytes", maxFrame)
		}
		if !isPrefix {
			return line, nil
		}
	}
}

// Exec runs one command through execd's POST /command. A command is sent
// once and never again: it may have run even when its answer was lost.
func (p *Provider) Exec(ctx context.Context, h provider.Handle, req provider.ExecRequest) (provider.ExecResult, error) {
	if err := p.check(h); err != nil {
		return provider.ExecResult{}, err
	}
	id := h.SandboxID
	ep, err := p.endpoint(ctx, id)
	if err != nil {
		return provider.ExecResult{}, err
	}
	workdir := workdirOf(h, p.opts.Workdir)
	body := map[string]any{"command": req.Command, "cwd": workdir}
	if req.Cwd != "" {
		body["cwd"] = resolve(workdir, req.Cwd)
	}
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
	r := p.execdRequest(ep, "run command", http.MethodPost, "/command")
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	hr, err := http.NewRequestWithContext(cctx, r.method, r.url, bytes.NewReader(b))
	if err != nil {
		return provider.ExecResult{}, err
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Accept", "text/event-stream")
	for k, v := range r.header {
		hr.Header.Set(k, v)
	}
	res, err := p.http.Do(hr)
	if err != nil {
		if ctx.Err() != nil {
			return provider.ExecResult{}, fmt.Errorf("opensandbox: run command: %w", ctx.Err())
		}
		return provider.ExecResult{}, p.gone(ctx, id, fmt.Errorf("opensandbox: run command: %w", err))
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
		aerr := (&response{status: res.StatusCode, header: res.Header, body: b}).apiError("run command")
		if res.StatusCode == http.StatusBadRequest {
			return provider.ExecResult{}, fmt.Errorf("%w: %w", aerr, provider.ErrInvalidSpec)
		}
		return provider.ExecResult{}, p.gone(ctx, id, aerr)
	}
	out, err := parseStream(res.Body, p.opts.OutputCap, req.Timeout)
	if err != nil {
		if ctx.Err() != nil {
			return provider.ExecResult{}, fmt.Errorf("opensandbox: run command: %w", ctx.Err())
		}
		return provider.ExecResult{}, p.gone(ctx, id, err)
	}
	return out, nil
}

// upload writes files (absolute path → data) in one multipart request of
// metadata/file pairs.
func (p *Provider) upload(ctx context.Context, h provider.Handle, files map[string][]byte) error {
	ep, err := p.endpoint(ctx, h.SandboxID)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
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
	req := p.execdRequest(ep, "upload files", http.MethodPost, "/files/upload")
	req.body, req.contentType, req.retry = buf.Bytes(), mw.FormDataContentType(), true
	resp, err := p.do(ctx, req)
	if err != nil {
		return p.gone(ctx, h.SandboxID, err)
	}
	if !resp.ok() {
		aerr := resp.apiError("upload files")
		if resp.status == http.StatusBadRequest {
			return fmt.Errorf("%w: %w", aerr, provider.ErrInvalidSpec)
		}
		return p.gone(ctx, h.SandboxID, aerr)
	}
	return nil
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
// wraps fs.ErrNotExist, a missing sandbox provider.ErrSandboxNotFound.
func (p *Provider) ReadFile(ctx context.Context, h provider.Handle, name string) ([]byte, error) {
	if err := p.check(h); err != nil {
		return nil, err
	}
	if name == "" {
		return nil, fmt.Errorf("opensandbox: read_file: empty path: %w", provider.ErrInvalidSpec)
	}
	ctx, cancel := context.WithTimeout(ctx, p.opTimeout())
	defer cancel()
	ep, err := p.endpoint(ctx, h.SandboxID)
	if err != nil {
		return nil, err
	}
	full := resolve(workdirOf(h, p.opts.Workdir), name)
	req := p.execdRequest(ep, "download file", http.MethodGet, "/files/download?"+url.Values{"path": {full}}.Encode())
	req.retry = true
	resp, err := p.do(ctx, req)
	if err != nil {
		return nil, p.gone(ctx, h.SandboxID, err)
	}
	switch {
	case resp.ok():
		return resp.body, nil
	case resp.status == http.StatusNotFound:
		// Either the file or the sandbox (through a proxy) is missing.
		if gerr := p.gone(ctx, h.SandboxID, resp.apiError("download file")); errors.Is(gerr, provider.ErrSandboxNotFound) {
			return nil, gerr
		}
		return nil, fmt.Errorf("opensandbox: read_file %s: %w", full, &fs.PathError{Op: "read", Path: full, Err: fs.ErrNotExist})
	}
	return nil, p.gone(ctx, h.SandboxID, resp.apiError("download file"))
}
