package http_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	nethttp "net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxowner/owner/clock"
	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/resources/notes"
)

// tcpServer serves a notes server with cfg's limits on a loopback TCP port
// (the per-IP limit needs real addresses) and returns its address.
func tcpServer(t *testing.T, cfg httpapi.Config) (string, *httpapi.Server) {
	t.Helper()
	clk := clock.NewManual(t0)
	own, err := owner.New(context.Background(), owner.Config{Name: "notes", Provider: fake.New(fake.Options{Clock: clk}), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Owner, cfg.Resources, cfg.Clock, cfg.LeaseTick = own, notes.New(notes.Options{}), clk, -1
	cfg.SessionSecret = []byte("a-test-secret-of-32-bytes-length")
	srv, err := httpapi.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		_ = ln.Close()
		<-served
		_ = own.Close()
	})
	return ln.Addr().String(), srv
}

// rawConn is a client connection that writes raw bytes.
type rawConn struct {
	t *testing.T
	net.Conn
	r *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &rawConn{t: t, Conn: c, r: bufio.NewReader(c)}
}

func (c *rawConn) send(s string) {
	c.t.Helper()
	if _, err := io.WriteString(c.Conn, s); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// answer reads one response, waiting at most d (a guard against a hang,
// not a synchronisation). A connection closed without a response is status
// 0.
func (c *rawConn) answer(d time.Duration) (status int, body string) {
	c.t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	resp, err := nethttp.ReadResponse(c.r, nil)
	if err != nil {
		if strings.Contains(err.Error(), "timeout") {
			c.t.Fatalf("no answer within %v: %v", d, err)
		}
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// closed reports whether the server closed the connection (EOF after any
// response), waiting at most d.
func (c *rawConn) closed(d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c.r)
	return err == nil // EOF; a timeout is an error
}

func health(t *testing.T, addr string) int {
	t.Helper()
	c := dialRaw(t, addr)
	c.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
	status, _ := c.answer(30 * time.Second)
	return status
}

// TestSlowBodyFloodCostsNeitherMemoryNorService: many connections announce
// 4 MB bodies and send two bytes. The server commits memory only for what
// arrived, /health answers during the flood, and each slow connection is
// answered 408 and closed at the read timeout.
func TestSlowBodyFloodCostsNeitherMemoryNorService(t *testing.T) {
	const conns = 300
	addr, _ := tcpServer(t, httpapi.Config{ReadTimeout: time.Second})
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	flood := make([]*rawConn, conns)
	for i := range flood {
		flood[i] = dialRaw(t, addr)
		flood[i].send("POST /seed_session HTTP/1.1\r\nHost: x\r\nContent-Length: 4000000\r\n\r\n{}")
	}
	if st := health(t, addr); st != 200 {
		t.Fatalf("/health during the flood: %d", st)
	}
	var wg sync.WaitGroup
	statuses := make([]int, conns)
	for i, c := range flood {
		wg.Add(1)
		go func() {
			defer wg.Done()
			statuses[i], _ = c.answer(30 * time.Second)
			if !c.closed(30 * time.Second) {
				statuses[i] = -1
			}
		}()
	}
	wg.Wait()
	for i, st := range statuses {
		if st != nethttp.StatusRequestTimeout {
			t.Fatalf("slow connection %d: status %d, want 408 then closed", i, st)
		}
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	// Everything the process allocated meanwhile, the test's own buffers
	// included: 4 MB per connection would be 1.2 GB.
	grew := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d slow connections: %d KB allocated in all, %d KB each", conns, grew>>10, grew/conns>>10)
	if grew > conns*256<<10 {
		t.Errorf("the flood allocated %d MB (%d KB a connection)", grew>>20, grew/conns>>10)
	}
	if st := health(t, addr); st != 200 {
		t.Fatalf("/health after the flood: %d", st)
	}
}

// TestBodyLimits: bodies over the limit are 413, announced or chunked, on
// their header or as they pass it; a header that never ends is a 408 at
// the read timeout. The bodies are read within a minute (each arrives
// whole at once, and on a loaded machine the server's reading can come
// later than a second after the connection); the slow header's server
// times out in a second.
func TestBodyLimits(t *testing.T) {
	addr, _ := tcpServer(t, httpapi.Config{MaxBodyBytes: 1 << 10, ReadTimeout: time.Minute})
	post := func(headers, body string) int {
		c := dialRaw(t, addr)
		c.send("POST /seed_session HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n" + body)
		st, _ := c.answer(30 * time.Second)
		return st
	}
	// Refused on its header, before any of the body is read.
	if st := post("Content-Length: 4000000000\r\n", "{"); st != 413 {
		t.Errorf("announced 4 GB: %d, want 413", st)
	}
	chunk := strings.Repeat("x", 600)
	if st := post("Transfer-Encoding: chunked\r\n", fmt.Sprintf("%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n", len(chunk), chunk, len(chunk), chunk)); st != 413 {
		t.Errorf("chunked body over the limit: %d, want 413", st)
	}
	if st := post("Transfer-Encoding: chunked\r\n", "2\r\n{}\r\n0\r\n\r\n"); st != 200 {
		t.Errorf("small chunked body: %d, want 200", st)
	}
	if st := post("Content-Length: 2\r\n", "{}"); st != 200 {
		t.Errorf("small body: %d, want 200", st)
	}
	// Exactly on the limit, announced or chunked, is read; one byte more
	// is not.
	for _, n := range []int{1 << 10, 1<<10 + 1} {
		want := 200
		if n > 1<<10 {
			want = 413
		}
		body := "{}" + strings.Repeat(" ", n-2)
		if st := post(fmt.Sprintf("Content-Length: %d\r\n", n), body); st != want {
			t.Errorf("a body of %d bytes: %d, want %d", n, st, want)
		}
		if st := post("Transfer-Encoding: chunked\r\n", fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", n, body)); st != want {
			t.Errorf("a chunked body of %d bytes: %d, want %d", n, st, want)
		}
	}
	// A header that never ends is a 408 at the read timeout.
	slow, _ := tcpServer(t, httpapi.Config{MaxBodyBytes: 1 << 10, ReadTimeout: time.Second})
	c := dialRaw(t, slow)
	c.send("POST /seed_session HTTP/1.1\r\nHost: x\r\nX-Slow: ")
	if st, _ := c.answer(30 * time.Second); st != 408 && st != 0 {
		t.Errorf("slow header: %d, want 408 or a closed connection", st)
	}
	if !c.closed(30 * time.Second) {
		t.Error("slow header: the connection stays open")
	}
}

func TestBodyMemoryBudget(t *testing.T) {
	// Two slow bodies hold the whole budget; a third is 503 at once.
	addr, srv := tcpServer(t, httpapi.Config{MaxBodyBytes: 1 << 20, BodyMemory: 128 << 10, ReadTimeout: 30 * time.Second})
	for i := 0; i < 2; i++ {
		c := dialRaw(t, addr)
		c.send("POST /seed_session HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n{")
	}
	guard := time.After(30 * time.Second)
	for ch := srv.BodyMemoryChanged(); srv.BodyMemoryInUse() < 128<<10; ch = srv.BodyMemoryChanged() {
		select {
		case <-ch:
		case <-guard:
			t.Fatalf("the two slow bodies hold %d bytes", srv.BodyMemoryInUse())
		}
	}
	c := dialRaw(t, addr)
	c.send("POST /seed_session HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n{")
	if st, body := c.answer(30 * time.Second); st != 503 || !strings.Contains(body, httpapi.CodeOverloaded) {
		t.Fatalf("a body past the budget: %d %s, want 503 overloaded", st, body)
	}
	// A request without a body still goes through.
	if st := health(t, addr); st != 200 {
		t.Fatalf("/health with the budget spent: %d", st)
	}
	// So does one whose body is announced empty.
	empty := dialRaw(t, addr)
	empty.send("POST /seed_session HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
	if st, body := empty.answer(30 * time.Second); st != 200 {
		t.Fatalf("an empty body with the budget spent: %d %s", st, body)
	}
}

func TestConnectionCaps(t *testing.T) {
	addr, _ := tcpServer(t, httpapi.Config{MaxConnsPerIP: 3})
	held := make([]*rawConn, 3)
	for i := range held {
		held[i] = dialRaw(t, addr)
		// Each answers one request, so it is surely counted before the
		// next is dialled.
		held[i].send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
		if st, _ := held[i].answer(30 * time.Second); st != 200 {
			t.Fatalf("connection %d: %d", i, st)
		}
	}
	extra := dialRaw(t, addr)
	if st, _ := extra.answer(30 * time.Second); st != 429 {
		t.Fatalf("a fourth connection from one address: %d, want 429", st)
	}
	if !extra.closed(30 * time.Second) {
		t.Fatal("the refused connection stays open")
	}

	addr, _ = tcpServer(t, httpapi.Config{MaxConns: 2})
	for i := 0; i < 2; i++ {
		c := dialRaw(t, addr)
		c.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
		if st, _ := c.answer(30 * time.Second); st != 200 {
			t.Fatalf("connection %d: %d", i, st)
		}
	}
	if st, _ := dialRaw(t, addr).answer(30 * time.Second); st != 503 {
		t.Fatalf("a connection past max_conns: %d, want 503", st)
	}
}

// TestBodyOfExactlyTheBudget: a body as large as the whole body-memory
// budget is read (what is reserved for it is what it needs, not a whole
// chunk more), and its memory is given back once it is answered.
func TestBodyOfExactlyTheBudget(t *testing.T) {
	const budget = 100 << 10 // a chunk and a part of one
	addr, srv := tcpServer(t, httpapi.Config{MaxBodyBytes: 1 << 20, BodyMemory: budget, ReadTimeout: 30 * time.Second})
	body := "{}" + strings.Repeat(" ", budget-2)
	c := dialRaw(t, addr)
	c.send(fmt.Sprintf("POST /seed_session HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
	if st, reply := c.answer(30 * time.Second); st != 200 {
		t.Fatalf("a body of exactly the budget: %d %s", st, reply)
	}
	if n := srv.BodyMemoryInUse(); n != 0 {
		t.Errorf("%d bytes of body memory still held after the answer", n)
	}
}

// TestAMalformedChunkedBodyIs400: a chunked body whose chunk size is no
// hex number is a 400 bad_request naming the body, and the connection is
// closed (the rest of the body is unread).
func TestAMalformedChunkedBodyIs400(t *testing.T) {
	addr, _ := tcpServer(t, httpapi.Config{MaxBodyBytes: 1 << 10, ReadTimeout: time.Minute})
	c := dialRaw(t, addr)
	c.send("POST /seed_session HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
	st, body := c.answer(30 * time.Second)
	if st != 400 || !strings.Contains(body, `"code":"`+httpapi.CodeBadRequest+`"`) || !strings.Contains(body, "reading the body") {
		t.Errorf("a malformed chunk: %d %s", st, body)
	}
	if !c.closed(30 * time.Second) {
		t.Error("the connection stayed open")
	}
}
