// Package http serves the owner's fasthttp endpoints.
package http

import _ "github.com/valyala/fasthttp"
