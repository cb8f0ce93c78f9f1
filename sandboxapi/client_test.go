package sandboxapi

import (
	"net"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
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
