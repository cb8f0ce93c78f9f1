package sandboxapi

import (
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestBearerSchemeIsCaseInsensitive: RFC 7235 makes the scheme's name
// case-insensitive; the control plane accepts it so too.
func TestBearerSchemeIsCaseInsensitive(t *testing.T) {
	w := newWorld(t)
	id, token := w.sandbox(t)
	for _, scheme := range []string{"Bearer", "bearer", "BEARER", "bEaReR"} {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetRequestURI("/sandboxes/" + id + "/exec")
		ctx.Request.Header.Set("Authorization", scheme+" "+token)
		ctx.Request.SetBodyString(`{"command":"true"}`)
		w.h.Serve(&ctx)
		if ctx.Response.StatusCode() != 200 {
			t.Errorf("scheme %q: %d %s", scheme, ctx.Response.StatusCode(), ctx.Response.Body())
		}
	}
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetRequestURI("/sandboxes/" + id + "/exec")
	ctx.Request.Header.Set("Authorization", "Basic "+token)
	ctx.Request.SetBodyString(`{"command":"true"}`)
	w.h.Serve(&ctx)
	if ctx.Response.StatusCode() != 401 || !strings.Contains(string(ctx.Response.Body()), "unauthorized") {
		t.Errorf("scheme Basic: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
}
