package http

import (
	"errors"
	"fmt"
	"io"
	nethttp "net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/internal/broadcast"
)

// Connection and body limits (the http.* keys). The defaults serve 1,024
// agents that each keep a data connection and a sandbox API connection
// open, all from one trainer host.
const (
	// DefaultReadTimeout bounds reading one request, headers and body.
	DefaultReadTimeout = 30 * time.Second
	// DefaultWriteTimeout bounds writing one response.
	DefaultWriteTimeout = 30 * time.Second
	// DefaultIdleTimeout closes a keep-alive connection with no request.
	DefaultIdleTimeout = 90 * time.Second
	// DefaultMaxConns bounds the connections served at once.
	DefaultMaxConns = 4096
	// DefaultMaxConnsPerIP bounds one client address's connections.
	DefaultMaxConnsPerIP = 2048
	// DefaultBodyMemory bounds the bytes of request bodies held at once,
	// across all connections.
	DefaultBodyMemory = 256 << 20

	// bodyChunk is how much of a body of unknown length (chunked) is
	// reserved and read at a time.
	bodyChunk = 64 << 10
)

// Codes of the limits.
const (
	CodeRequestTimeout = "request_timeout"
	CodeOverloaded     = "overloaded"
)

// budget is a count of bytes that request bodies may hold at once: a body is
// read only into memory reserved here, so a flood of bodies (fast or slow)
// costs at most the budget, not connections × the body limit.
//
// Every request with a body takes from it and gives back, so it takes no
// lock (one shared by all requests was where they queued: 80% of the lock
// waiting under load) and its change signal allocates only when someone
// waits for it.
type budget struct {
	total   int64
	left    atomic.Int64
	changed broadcast.Broadcast
}

func newBudget(n int64) *budget {
	b := &budget{total: n}
	b.left.Store(n)
	return b
}

// take reserves n bytes, or reports false without reserving any.
func (b *budget) take(n int64) bool {
	for {
		left := b.left.Load()
		if left < n {
			return false
		}
		if b.left.CompareAndSwap(left, left-n) {
			b.changed.Fire()
			return true
		}
	}
}

func (b *budget) give(n int64) {
	if n == 0 {
		return
	}
	b.left.Add(n)
	b.changed.Fire()
}

// inUse is the bytes held now and a channel closed at the next change
// (taken first, so that a change after the count is not missed).
func (b *budget) inUse() (int64, <-chan struct{}) {
	ch := b.changed.Wait()
	return b.total - b.left.Load(), ch
}

// BodyMemoryInUse is how many bytes request bodies hold now.
func (s *Server) BodyMemoryInUse() int64 {
	n, _ := s.bodies.inUse()
	return n
}

// BodyMemoryChanged is closed at the next change of BodyMemoryInUse.
func (s *Server) BodyMemoryChanged() <-chan struct{} {
	_, ch := s.bodies.inUse()
	return ch
}

// errBudget: the body budget is spent.
var errBudget = errors.New("request bodies in flight use up their memory budget")

// readBody reads the request's streamed body within the size limit and the
// memory budget, and sets it as the request's body. On failure it answers
// (413, 408, 503 or 400), closes the connection (what is left of the body
// is unread) and reports false. The returned func gives the memory back.
func (s *Server) readBody(ctx *fasthttp.RequestCtx) (release func(), ok bool) {
	stream := ctx.RequestBodyStream()
	if stream == nil {
		return func() {}, true // not streamed: fasthttp read it (tests call Handler directly)
	}
	limit := s.cfg.MaxBodyBytes
	var held int64
	release = func() { s.bodies.give(held); held = 0 }
	fail := func(status int, code, detail string) (func(), bool) {
		release()
		ctx.SetConnectionClose()
		writeError(ctx, status, code, detail)
		return nil, false
	}
	cl := ctx.Request.Header.ContentLength()
	if cl > limit {
		return fail(nethttp.StatusRequestEntityTooLarge, CodeBodyTooLarge, fmt.Sprintf("request body over %d bytes", limit))
	}
	want := cl
	if cl < 0 {
		want = limit + 1 // chunked: one byte over the limit tells it is over
	}
	body, err := s.readUpTo(stream, want, &held)
	if err == nil && len(body) > limit {
		err = fasthttp.ErrBodyTooLarge
	}
	switch {
	case errors.Is(err, errBudget):
		return s.overloaded(ctx, release)
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return fail(nethttp.StatusRequestEntityTooLarge, CodeBodyTooLarge, fmt.Sprintf("request body over %d bytes", limit))
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fail(nethttp.StatusRequestTimeout, CodeRequestTimeout, fmt.Sprintf("the body did not arrive within %v", s.cfg.ReadTimeout))
	case err != nil:
		return fail(nethttp.StatusBadRequest, CodeBadRequest, "reading the body: "+err.Error())
	}
	if body == nil {
		body = []byte{}
	}
	ctx.Request.SetBodyRaw(body)
	return release, true
}

// readUpTo reads at most want bytes of a body, stopping early at its end.
// Memory is reserved and allocated as bytes arrive (doubling from
// bodyChunk), never for what a client only announced: a client that
// announces megabytes and sends two bytes holds one chunk. held counts what
// was reserved.
func (s *Server) readUpTo(stream io.Reader, want int, held *int64) ([]byte, error) {
	var body []byte
	for len(body) < want {
		if len(body) == cap(body) {
			grow := min(max(bodyChunk, len(body)), want-len(body))
			if !s.bodies.take(int64(grow)) {
				return nil, errBudget
			}
			*held += int64(grow)
			// Exactly what was reserved (append could round it up).
			grown := make([]byte, len(body), len(body)+grow)
			copy(grown, body)
			body = grown
		}
		n, err := stream.Read(body[len(body):cap(body)])
		body = body[:len(body)+n]
		if errors.Is(err, io.EOF) {
			return body, nil
		}
		if err != nil {
			return nil, err
		}
	}
	return body, nil
}

func (s *Server) overloaded(ctx *fasthttp.RequestCtx, release func()) (func(), bool) {
	release()
	ctx.SetConnectionClose()
	ctx.Response.Header.Set("Retry-After", "1")
	writeError(ctx, nethttp.StatusServiceUnavailable, CodeOverloaded, "too many request bodies in flight; retry")
	return nil, false
}

// setDefault sets *v to def when it is zero or negative.
func setDefault[T int | int64 | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// fasthttpLogger sends fasthttp's own lines (a connection refused at a
// limit, a listener error) to the one logger, as warnings.
type fasthttpLogger struct{ log logrus.FieldLogger }

func (l fasthttpLogger) Printf(format string, args ...any) { l.log.Warnf(format, args...) }
