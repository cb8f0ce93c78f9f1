package envelope_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

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

// appender writes fixed bytes, or fails.
type appender struct {
	out string
	err error
}

func (a appender) AppendJSON(dst []byte) ([]byte, error) { return append(dst, a.out...), a.err }

// An envelope is what json.Marshal writes for it, whatever its detail
// holds; a reply that writes itself is answered as written, or as a 500
// when it fails; a reply's bytes stay as they were when the next reply
// reuses the buffer.
func TestEnvelopeBytes(t *testing.T) {
	detail := "<b> & \"q\" \xff \u2028 \n"
	var ctx fasthttp.RequestCtx
	envelope.WriteError(&ctx, 400, "bad_request", detail)
	want, _ := json.Marshal(envelope.Body{Error: envelope.Detail{Code: "bad_request", Detail: detail}})
	if diff := cmp.Diff(string(want), string(ctx.Response.Body())); diff != "" {
		t.Errorf("envelope (-json.Marshal +written):\n%s", diff)
	}
	var first, second fasthttp.RequestCtx
	envelope.WriteJSON(&first, 200, appender{out: `{"a":1}`})
	envelope.WriteJSON(&second, 201, appender{out: `{"b":22222222}`})
	if got := string(first.Response.Body()) + " " + string(second.Response.Body()); got != `{"a":1} {"b":22222222}` || second.Response.StatusCode() != 201 {
		t.Errorf("two replies: %s (%d), want {\"a\":1} {\"b\":22222222} (201)", got, second.Response.StatusCode())
	}
	var failed fasthttp.RequestCtx
	envelope.WriteJSON(&failed, 200, appender{out: `{"half`, err: errors.New("cannot")})
	if got := string(failed.Response.Body()); failed.Response.StatusCode() != 500 || got != `{"error":{"code":"internal_error","detail":"reply is not JSON: cannot"}}` {
		t.Errorf("a failing appender: %d %s", failed.Response.StatusCode(), got)
	}
}
