package envelope_test

import (
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/internal/envelope"
)

func TestEnvelope(t *testing.T) {
	var ctx fasthttp.RequestCtx
	envelope.WriteError(&ctx, 409, "conflict", `a "quoted" detail`)
	if got, want := string(ctx.Response.Body()), `{"error":{"code":"conflict","detail":"a \"quoted\" detail"}}`; got != want || ctx.Response.StatusCode() != 409 || string(ctx.Response.Header.ContentType()) != "application/json" {
		t.Fatalf("%d %s %q, want 409 %s", ctx.Response.StatusCode(), ctx.Response.Header.ContentType(), got, want)
	}
	var ok fasthttp.RequestCtx
	envelope.WriteJSON(&ok, 200, map[string]int{"n": 1})
	if got := string(ok.Response.Body()); got != `{"n":1}` || ok.Response.StatusCode() != 200 {
		t.Fatalf("reply %d %s", ok.Response.StatusCode(), got)
	}
	var bad fasthttp.RequestCtx
	envelope.WriteJSON(&bad, 200, func() {})
	if bad.Response.StatusCode() != 500 || string(bad.Response.Body())[:40] != `{"error":{"code":"internal_error","detai` {
		t.Fatalf("an unencodable reply: %d %s", bad.Response.StatusCode(), bad.Response.Body())
	}
}
