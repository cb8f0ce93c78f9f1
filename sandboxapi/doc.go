// Package sandboxapi serves the routes through which an agent works in a
// sandbox the owner lends it: access tokens, and a fasthttp handler for
// exec and file calls.
//
// # Routes
//
// Under Prefix, each authorised by "Authorization: Bearer <token>":
//
//	POST /sandboxes/{sandbox_id}/exec          {"command", "cwd", "env", "timeout_ms"}
//	                                           → {"stdout", "stderr", "exit_code", "truncated", "timed_out"?}
//	GET  /sandboxes/{sandbox_id}/files?path=P  → the file's bytes (application/octet-stream)
//	PUT  /sandboxes/{sandbox_id}/files?path=P  body: the bytes → {"path", "size"}
//
// cwd and path are relative to the sandbox's workdir or absolute under it.
// Handler's comment lists every error status and code.
//
// # Tokens
//
// A token is HMAC-SHA256-signed and names one sandbox and an expiry, so an
// agent needs only the endpoint and the token, and any server holding the
// secret verifies it after a restart. /sandbox_access adds Tokens.Access's
// fields to its descriptor:
//
//	"endpoint": "http://<host>:<port>/sandboxes/<sandbox_id>", "token": "v1.…", "token_expires_at": "…"
//
// # Superseded and ended sandboxes
//
// The handler asks a Resolver what became of the sandbox a (genuine) token
// names. When a restore replaced it with a fork, the answer is 410
// "superseded" and the agent must ask /sandbox_access again, instead of
// silently writing into the old sandbox as upstream's borrowers do; when its
// session ended, 410 "ended". A missing or forged token is 401 before any of
// that.
//
// # Mounting
//
// The server's router sends every path under Prefix to (*Handler).Serve, or
// splits the path itself (SplitPath) and calls ServeSandbox. The handler
// copies what it keeps of the request and uses its own contexts (a fasthttp
// RequestCtx is done only at server shutdown), so a draining server lets
// in-flight commands finish.
package sandboxapi
