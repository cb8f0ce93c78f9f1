package sandboxapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local"
)

// watchClient hears a client that closes its connection mid-call, through
// fasthttp's per-IP wrapper.
func TestWatchClientHearsAClientGoAway(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := make(chan struct{})
	running := make(chan struct{})
	srv := &fasthttp.Server{MaxConnsPerIP: 8, Handler: func(ctx *fasthttp.RequestCtx) {
		stop := watchClient(ctx.Conn(), func() { close(gone) })
		defer stop()
		close(running)
		select {
		case <-gone:
			ctx.SetBodyString("gone")
		case <-time.After(time.Minute): // a bound on a broken test
			ctx.SetBodyString("timeout")
		}
	}}
	go srv.Serve(ln)
	defer srv.Shutdown()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	<-running
	conn.Close()
	select {
	case <-gone:
	case <-time.After(30 * time.Second):
		t.Fatal("the server never heard the client go")
	}
}

// TestAdmissionWaitsOnlyWhileTheClientDoes: an exec waiting at admission
// waits with its request: the wait's context ends when the client goes.
func TestAdmissionWaitsOnlyWhileTheClientDoes(t *testing.T) {
	w := newWorld(t)
	id, token := w.sandbox(t)
	waiting, ended := make(chan struct{}), make(chan error, 1)
	w.h.Admit = func(ctx context.Context, _ string) (func(), error) {
		close(waiting)
		select {
		case <-ctx.Done():
			ended <- ctx.Err()
			return nil, ctx.Err()
		case <-time.After(time.Minute): // a bound on a broken test
			ended <- nil
			return nil, errors.New("the wait never ended")
		}
	}
	conn := rawExec(t, w, id, token, `{"command":"true"}`)
	select {
	case <-waiting:
	case <-time.After(time.Minute):
		t.Fatal("the exec never reached admission")
	}
	conn.Close()
	if err := <-ended; !errors.Is(err, context.Canceled) {
		t.Fatalf("the admission wait after the client went: %v, want context.Canceled", err)
	}
}

// blockingProvider's exec runs until its context ends, and says why.
type blockingProvider struct {
	*local.Provider
	running chan struct{}
	ended   chan error
}

func (p *blockingProvider) Exec(ctx context.Context, _ provider.Handle, _ provider.ExecRequest) (provider.ExecResult, error) {
	close(p.running)
	select {
	case <-ctx.Done():
		p.ended <- ctx.Err()
		return provider.ExecResult{}, ctx.Err()
	case <-time.After(time.Minute): // a bound on a broken test
		p.ended <- nil
		return provider.ExecResult{}, errors.New("the exec never ended")
	}
}

// TestAnExecEndsWhenItsClientGoes: an exec with no timeout_ms, on a handler
// with no admission, still runs only while its client is there: its
// context ends when the client closes the connection.
func TestAnExecEndsWhenItsClientGoes(t *testing.T) {
	w := newWorld(t)
	id, token := w.sandbox(t)
	p := &blockingProvider{Provider: w.p, running: make(chan struct{}), ended: make(chan error, 1)}
	w.h.Provider = p
	conn := rawExec(t, w, id, token, `{"command":"sleep 600"}`)
	select {
	case <-p.running:
	case <-time.After(time.Minute):
		t.Fatal("the exec never reached the provider")
	}
	conn.Close()
	if err := <-p.ended; !errors.Is(err, context.Canceled) {
		t.Fatalf("the exec after its client went: %v, want context.Canceled", err)
	}
}

// rawExec serves w's handler on loopback and sends it an exec of body for
// sandbox id over a connection of its own, which the caller closes to play
// a client that goes.
func rawExec(t *testing.T, w *world, id, token, body string) net.Conn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: w.h.Serve}
	go srv.Serve(ln)
	t.Cleanup(func() { _ = srv.Shutdown() })
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /sandboxes/%s/exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s", id, token, len(body), body)
	return conn
}
