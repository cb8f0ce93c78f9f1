package sandboxapi

import (
	"context"
	"io"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"
	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local"
)

// requestProvider records the request id each call's context carries.
type requestProvider struct {
	*local.Provider
	// opener: files are streamed through OpenFile, not read whole.
	opener bool
	mu     sync.Mutex
	ids    []string
}

func (p *requestProvider) saw(ctx context.Context, op string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ids = append(p.ids, op+" "+logs.RequestIDOf(ctx))
}

func (p *requestProvider) Exec(ctx context.Context, h provider.Handle, req provider.ExecRequest) (provider.ExecResult, error) {
	p.saw(ctx, "exec")
	return p.Provider.Exec(ctx, h, req)
}

func (p *requestProvider) WriteFile(ctx context.Context, h provider.Handle, path string, data []byte) error {
	p.saw(ctx, "write")
	return p.Provider.WriteFile(ctx, h, path, data)
}

func (p *requestProvider) OpenFile(ctx context.Context, h provider.Handle, path string) (io.ReadCloser, int64, error) {
	p.saw(ctx, "open")
	return p.Provider.OpenFile(ctx, h, path)
}

func (p *requestProvider) ReadFile(ctx context.Context, h provider.Handle, path string) ([]byte, error) {
	p.saw(ctx, "read")
	return p.Provider.ReadFile(ctx, h, path)
}

// Capabilities hands this provider out as the file opener when opener is
// set, none otherwise.
func (p *requestProvider) Capabilities() provider.Capabilities {
	c := p.Provider.Capabilities()
	c.FileOpener = nil
	if p.opener {
		c.FileOpener = p
	}
	return c
}

// TestProviderCallsCarryTheRequestID: every provider call a request makes
// carries the request's id (from LogFields) in its context, so that the
// provider's lines about it name the request; without LogFields, none.
func TestProviderCallsCarryTheRequestID(t *testing.T) {
	w := newWorld(t)
	id, token := w.sandbox(t)
	p := &requestProvider{Provider: w.p}
	w.h.Provider = p
	w.h.LogFields = func(ctx *fasthttp.RequestCtx) logrus.Fields {
		return logrus.Fields{logs.RequestID: "req-" + string(ctx.Method())}
	}
	calls := func() {
		t.Helper()
		for _, c := range []struct{ method, uri, body string }{
			{"POST", "/sandboxes/" + id + "/exec", `{"command":"true"}`},
			{"POST", "/sandboxes/" + id + "/exec", `{"command":"true","timeout_ms":5000}`},
			{"PUT", "/sandboxes/" + id + "/files?path=a.txt", "x"},
			{"GET", "/sandboxes/" + id + "/files?path=a.txt", ""},
		} {
			if r := w.do(c.method, c.uri, token, []byte(c.body)); r.Status != 200 {
				t.Fatalf("%s %s: %d %s", c.method, c.uri, r.Status, r.Body)
			}
		}
	}
	calls()
	p.opener = true
	w.do("GET", "/sandboxes/"+id+"/files?path=a.txt", token, nil)
	p.opener = false
	w.h.LogFields = nil
	calls()
	want := []string{"exec req-POST", "exec req-POST", "write req-PUT", "read req-GET", "open req-GET", "exec ", "exec ", "write ", "read "}
	if diff := cmp.Diff(want, p.ids); diff != "" {
		t.Errorf("request ids of the provider calls (-want +got):\n%s", diff)
	}
}
