// Package envelope writes the one JSON error envelope both HTTP surfaces
// answer with, {"error":{"code","detail"}}, and their JSON replies.
package envelope

import (
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/internal/jsonw"
)

// Body is the envelope.
type Body struct {
	Error Detail `json:"error"`
}

// Detail is the envelope's content.
type Detail struct {
	Code   string `json:"code"`
	Detail string `json:"detail"`
}

// CodeInternal answers a reply that could not be encoded.
const CodeInternal = "internal_error"

// Appender is a reply that writes its own JSON (what json.Marshal would
// write for it), so that a hot route's reply costs no reflection.
type Appender interface {
	AppendJSON(dst []byte) ([]byte, error)
}

// bufs recycles the buffers replies are encoded in: the response copies
// the bytes, so a buffer is free again once the body is set.
var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// WriteJSON answers v as JSON with status; a v that does not encode is a
// 500 envelope instead. An Appender and the values package jsonw writes
// (maps of strings, say) are encoded without reflection.
func WriteJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	bp := bufs.Get().(*[]byte)
	defer bufs.Put(bp)
	var b []byte
	var err error
	if a, ok := v.(Appender); ok {
		b, err = a.AppendJSON((*bp)[:0])
	} else {
		b, err = jsonw.Append((*bp)[:0], v)
	}
	*bp = b[:0]
	if err != nil {
		WriteError(ctx, fasthttp.StatusInternalServerError, CodeInternal, "reply is not JSON: "+err.Error())
		return
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// WriteError answers the envelope with status.
func WriteError(ctx *fasthttp.RequestCtx, status int, code, detail string) {
	bp := bufs.Get().(*[]byte)
	defer bufs.Put(bp)
	b := append((*bp)[:0], `{"error":{"code":`...)
	b = jsonw.AppendString(b, code)
	b = append(b, `,"detail":`...)
	b = jsonw.AppendString(b, detail)
	b = append(b, "}}"...)
	*bp = b[:0]
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}
