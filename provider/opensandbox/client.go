package opensandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/provider"
)

// APIKeyHeader authenticates the lifecycle API.
const APIKeyHeader = "OPEN-SANDBOX-API-KEY"

// APIKeyEnv is the environment variable the API key is read from when the
// configuration names none.
const APIKeyEnv = "OPEN_SANDBOX_API_KEY"

// ExecdPort is the port execd listens on inside a sandbox.
const ExecdPort = 44772

// ExecdTokenHeader carries a sandbox's execd access token. Every sandbox is
// created with a random one in execdTokenEnv, which its execd then requires
// of every call (401 without it): a call meant for one sandbox that reaches
// another's execd (a host port the runtime gave to another container after
// a restart, another sandbox's agent on the same network) is refused.
const ExecdTokenHeader = "X-EXECD-ACCESS-TOKEN"

// execdTokenEnv is the variable execd reads its access token from.
const execdTokenEnv = "EXECD_ACCESS_TOKEN"

// Defaults.
const (
	DefaultTTL                    = time.Hour
	MinTTL                        = time.Minute
	DefaultRequestTimeout         = 30 * time.Second
	DefaultReadyTimeout           = 5 * time.Minute
	DefaultSnapshotTimeout        = 15 * time.Minute
	DefaultMaxConcurrentSnapshots = 2
	DefaultMaxConcurrentCreates   = 64
	DefaultPollInterval           = 500 * time.Millisecond
	DefaultMaxRetries             = 5
	DefaultCPU                    = "1"
	DefaultMemory                 = "2Gi"
	DefaultWorkdir                = "/workspace"
	DefaultOutputCap              = 1 << 20
	// maxFrame bounds one line of the command stream.
	maxFrame = 16 << 20
	// maxResponse bounds a lifecycle answer or a downloaded file.
	maxResponse = 256 << 20
)

// ErrAPI marks an answer of the server that is not a success; the error is an
// *APIError.
var ErrAPI = errors.New("opensandbox: API error")

// APIError is a non-2xx answer: the status and the {code,message} body.
type APIError struct {
	Op      string
	Status  int
	Code    string
	Message string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("opensandbox: %s: HTTP %d %s: %s", e.Op, e.Status, e.Code, e.Message)
}

// Unwrap makes errors.Is(err, ErrAPI) true.
func (e *APIError) Unwrap() error { return ErrAPI }

// response is one answer, read whole.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r *response) ok() bool { return r.status >= 200 && r.status < 300 }

// apiError turns a non-2xx answer into an *APIError. The lifecycle server
// answers in three shapes: its own {code, message}, FastAPI's validation
// error {detail: [{loc, msg}, ...]} (422) and {detail: "..."} (unknown
// route or method); execd answers {code, message} or {error}.
func (r *response) apiError(op string) *APIError {
	e := &APIError{Op: op, Status: r.status}
	var body struct {
		Code    string          `json:"code"`
		Message string          `json:"message"`
		Error   string          `json:"error"` // execd's own error shape
		Detail  json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(r.body, &body) == nil {
		e.Code, e.Message = body.Code, body.Message
		if e.Message == "" {
			e.Message = body.Error
		}
		if e.Message == "" && len(body.Detail) > 0 {
			e.Message = detailMessage(body.Detail)
		}
	}
	if e.Message == "" {
		e.Message = string(bytes.TrimSpace(r.body))
	}
	if len(e.Message) > 500 {
		e.Message = e.Message[:500]
	}
	return e
}

// detailMessage renders FastAPI's detail: a string, or a list of
// {loc, msg} as "loc.path: msg; ...".
func detailMessage(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var items []struct {
		Loc []any  `json:"loc"`
		Msg string `json:"msg"`
	}
	if json.Unmarshal(raw, &items) != nil {
		return string(raw)
	}
	parts := make([]string, 0, len(items))
	for _, it := range items {
		loc := make([]string, 0, len(it.Loc))
		for _, l := range it.Loc {
			loc = append(loc, fmt.Sprint(l))
		}
		parts = append(parts, strings.Join(loc, ".")+": "+it.Msg)
	}
	return strings.Join(parts, "; ")
}

// request is one HTTP call to make.
type request struct {
	op          string
	method, url string
	body        []byte
	contentType string
	header      map[string]string
	// retry: whether a failure may be tried again (never for a command).
	retry bool
	// beforeRetry, when set, runs before an attempt that follows an
	// ambiguous failure (one that may have taken effect): it reports
	// whether the effect is there after all, which ends the call.
	beforeRetry func(ctx context.Context) (bool, error)
	// timeout bounds each attempt (default Options.RequestTimeout).
	timeout time.Duration
	// sandbox names the sandbox of an execd call ("" for the lifecycle
	// API), whose client makes it (execdClient).
	sandbox string
}

// errAdopted ends a call whose earlier attempt turned out to have worked.
var errAdopted = errors.New("opensandbox: an earlier attempt took effect")

// retryable statuses: the server (or a proxy) did not do the request, or
// may not have. 501 is an answer: the runtime lacks the feature.
func retryableStatus(status int) bool {
	return status == http.StatusRequestTimeout || status == http.StatusTooEarly ||
		status == http.StatusTooManyRequests || (status >= 500 && status != http.StatusNotImplemented)
}

// ambiguous: the request may have taken effect.
func ambiguous(status int, err error) bool {
	if err != nil {
		return true
	}
	return status == http.StatusInternalServerError || status == http.StatusBadGateway || status == http.StatusGatewayTimeout
}

// retryAfter reads Retry-After (seconds or an HTTP date).
func retryAfter(h http.Header, now time.Time) time.Duration {
	v := h.Get("Retry-After")
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return t.Sub(now)
	}
	return 0
}

// jitter draws random numbers for backoff under a lock (rand.Rand is not
// safe for concurrent use).
type jitter struct {
	mu  sync.Mutex
	rng *rand.Rand
}

func (j *jitter) float() float64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.rng.Float64()
}

// backoff is the wait before retry n (0-based): 250ms doubling to 10s, with
// ±25% jitter, at least what Retry-After asks.
func (p *Provider) backoff(n int, ra time.Duration) time.Duration {
	d := 250 * time.Millisecond << min(n, 6)
	d = min(d, 10*time.Second)
	d = time.Duration(float64(d) * (0.75 + 0.5*p.rng.float()))
	return max(d, ra)
}

// do sends req, retrying as it allows; it returns the last answer (which may
// be a failure status) or the transport error of the last attempt. A
// lifecycle call that gets no answer marks the server unreachable (and
// wraps provider.ErrUnavailable); while it is, such a call is not retried,
// so that requests fail at once instead of each waiting through the
// backoff; any answer marks it reachable again.
func (p *Provider) do(ctx context.Context, req request) (*response, error) {
	lifecycle := strings.HasPrefix(req.url, p.base+"/")
	// Known unreachable when the call began: one attempt only.
	wasDown := lifecycle && p.Unreachable() != nil
	for attempt := 0; ; attempt++ {
		resp, err := p.once(ctx, req)
		if lifecycle && ctx.Err() == nil {
			p.setReachable(err)
		}
		// An answer that came is kept even if ctx ended meanwhile: it may
		// name what the call made.
		if err == nil && !retryableStatus(resp.status) {
			return resp, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("opensandbox: %s: %w", req.op, ctx.Err())
		}
		if lookRefused(err) {
			// An execd call not made: its sandbox ended, or the lifecycle
			// server, asked with retries, did not say.
			return nil, fmt.Errorf("opensandbox: %s: %w", req.op, err)
		}
		if !req.retry || attempt >= p.opts.MaxRetries || (err != nil && wasDown) {
			if err != nil && lifecycle {
				return nil, fmt.Errorf("opensandbox: %s: the lifecycle server at %s is unreachable: %w (%w)", req.op, p.opts.Domain, err, provider.ErrUnavailable)
			}
			if err != nil {
				return nil, fmt.Errorf("opensandbox: %s: %w", req.op, err)
			}
			return resp, nil
		}
		var ra time.Duration
		status := 0
		if resp != nil {
			ra, status = retryAfter(resp.header, p.clk.Now()), resp.status
		}
		wait := p.backoff(attempt, ra)
		logs.ForRequest(ctx, p.log).WithFields(logrus.Fields{"op": req.op, "status": status, "attempt": attempt + 1, "wait": wait}).WithError(err).Debug("opensandbox: retrying")
		if err := p.sleep(ctx, wait); err != nil {
			return nil, fmt.Errorf("opensandbox: %s: %w", req.op, err)
		}
		if req.beforeRetry != nil && ambiguous(status, err) {
			done, err := req.beforeRetry(ctx)
			if err != nil {
				return nil, fmt.Errorf("opensandbox: %s: look for an earlier attempt: %w", req.op, err)
			}
			if done {
				return nil, errAdopted
			}
		}
	}
}

// setReachable records the outcome of a lifecycle call: err is the
// transport error of an attempt that got no answer, nil for an answer.
func (p *Provider) setReachable(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.unreachable = err
}

// Unreachable is nil while the lifecycle server answers, and the error of
// the last call that got no answer while it does not.
func (p *Provider) Unreachable() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.unreachable == nil {
		return nil
	}
	return fmt.Errorf("the lifecycle server at %s is unreachable: %w", p.opts.Domain, p.unreachable)
}

// Probe makes one call to the lifecycle server, without retries, and says
// whether it answers as it should: an unreachable server or a refused API
// key is an error naming the domain. A startup reports it at once.
func (p *Provider) Probe(ctx context.Context) error {
	req := request{op: "probe", method: http.MethodGet, url: p.base + "/sandboxes?pageSize=1", header: p.apiHeader()}
	resp, err := p.do(ctx, req)
	switch {
	case err != nil:
		return err
	case !resp.ok():
		return fmt.Errorf("opensandbox: the lifecycle server at %s answers: %w", p.opts.Domain, resp.apiError("probe"))
	}
	return nil
}

// once makes one attempt.
func (p *Provider) once(ctx context.Context, req request) (*response, error) {
	timeout := req.timeout
	if timeout <= 0 {
		timeout = p.opts.RequestTimeout
	}
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var body io.Reader
	if req.body != nil {
		body = bytes.NewReader(req.body)
	}
	hr, err := http.NewRequestWithContext(actx, req.method, req.url, body)
	if err != nil {
		return nil, err
	}
	if req.contentType != "" {
		hr.Header.Set("Content-Type", req.contentType)
	}
	for k, v := range req.header {
		hr.Header.Set(k, v)
	}
	res, err := p.execdClient(req.sandbox).Do(hr)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := readBody(res.Body, res.ContentLength, maxResponse)
	if err != nil {
		return nil, err
	}
	return &response{status: res.StatusCode, header: res.Header, body: b}, nil
}

// readBody reads at most limit bytes of r into a buffer the size the
// answer announced (length, -1 when unknown), so that a large download is
// read without growing its buffer by doubling; an announced length past
// limit, or a wrong one, only costs growth.
func readBody(r io.Reader, length, limit int64) ([]byte, error) {
	buf := bytes.NewBuffer(make([]byte, 0, min(max(length, 0), limit)+bytes.MinRead))
	_, err := buf.ReadFrom(io.LimitReader(r, limit))
	return buf.Bytes(), err
}

// api makes a lifecycle API call with the API key.
func (p *Provider) api(ctx context.Context, op, method, path string, body any, retry bool) (*response, error) {
	req := request{op: op, method: method, url: p.base + path, retry: retry, header: map[string]string{}}
	if p.opts.APIKey != "" {
		req.header[APIKeyHeader] = p.opts.APIKey
	}
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		req.body, req.contentType = b, "application/json"
	}
	return p.do(ctx, req)
}

// sleepReal waits d or until ctx ends.
func sleepReal(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Options configure the provider.
type Options struct {
	// Domain is host:port of the lifecycle server; Protocol is http or
	// https (default http).
	Domain, Protocol string
	// APIKey is sent in OPEN-SANDBOX-API-KEY.
	APIKey string
	// UseServerProxy reaches execd through the server's proxy route.
	UseServerProxy bool
	// TTL is the lease of a sandbox whose spec names none (default 1h).
	TTL time.Duration
	// Images maps a spec's image name to an image URI; a name not in it is
	// the URI.
	Images map[string]string
	// CPU and Memory are the resourceLimits of a spec that asks for none
	// (defaults "1", "2Gi").
	CPU, Memory string
	// RequestTimeout bounds one HTTP attempt (default 30s).
	RequestTimeout time.Duration
	// ReadyTimeout bounds a start or fork until execd answers (default
	// 5m); a spec's ready_timeout_s overrides it.
	ReadyTimeout time.Duration
	// SnapshotTimeout bounds a snapshot from its request to Ready, and the
	// retries of deleting one still Creating (default 15m).
	SnapshotTimeout time.Duration
	// MaxConcurrentSnapshots bounds snapshots in flight (default 2, the
	// server's own capture limit); the rest queue here, not on the
	// server, so a snapshot's deadline is spent on its own capture.
	MaxConcurrentSnapshots int
	// MaxConcurrentCreates bounds creates (starts and forks) in flight.
	MaxConcurrentCreates int
	// PollInterval is the longest wait between polls of a Pending sandbox,
	// a Creating snapshot or execd's ping (default 500ms); the first polls
	// of a wait come sooner.
	PollInterval time.Duration
	// MaxRetries is how many times a failed call is tried again (default 5).
	MaxRetries int
	// Entrypoint is every sandbox's entrypoint (default tail -f /dev/null:
	// the owner runs everything through execd).
	Entrypoint []string
	// Workdir is the workdir of a spec that names none (default /workspace).
	Workdir string
	// ListLabels restricts ListSandboxes and ListSnapshots to what carries
	// these metadata labels (the server may not filter, so the client does).
	ListLabels map[string]string
	// OutputCap caps each of a command's stdout and stderr (default 1 MiB).
	OutputCap int
	// Clock reads time (timestamps, expiries, deadlines); default wall.
	Clock clock.Clock
	// Sleep waits between polls and retries; default a timer. A test on a
	// manual clock passes one that advances it.
	Sleep func(ctx context.Context, d time.Duration) error
	// Seed seeds the backoff jitter.
	Seed uint64
	// HTTPClient makes the calls (default one with a pooled transport).
	HTTPClient *http.Client
	// Logger gets the provider's logs (default discarded).
	Logger logrus.FieldLogger
}
