// Package envelope writes the one JSON error envelope both HTTP surfaces
// answer with, {"error":{"code","detail"}}, and their JSON replies.
package envelope

import (
	"encoding/json"

	"github.com/valyala/fasthttp"
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

// WriteJSON answers v as JSON with status; a v that does not encode is a
// 500 envelope instead.
func WriteJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := json.Marshal(v)
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
	b, _ := json.Marshal(Body{Error: Detail{Code: code, Detail: detail}})
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}
