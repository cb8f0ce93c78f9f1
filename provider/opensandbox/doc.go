// Package opensandbox is the sandbox provider for an OpenSandbox server
// (Kubernetes or Docker): a client of its lifecycle API and of each
// sandbox's execd, written from the OpenAPI specs.
//
// A sandbox is created with exactly one of image{uri} or snapshotId, this
// provider's entrypoint, a timeout (the lease, renewed by the owner with an
// absolute expiresAt), resourceLimits and the owner's labels as metadata
// (Kubernetes label grammar; values that break it travel encoded). Creation
// answers 202; Start polls until Running, Failed or the ready deadline, then
// until execd answers /ping, and deletes a sandbox that does not come up.
// A snapshot keeps the rootfs only, never processes; a fork is a create from
// its snapshotId. Commands, uploads and downloads go to execd at the endpoint
// of port 44772, with the headers the endpoint names (the Docker runtime
// names none) and the sandbox's execd access token: every create (a fork's
// too) gives the sandbox a random one of its own in EXECD_ACCESS_TOKEN, which
// its execd then wants of every call, and a label keeps it for a server
// started again. A call refused by another execd (401, 403) or that found
// none resolves the endpoint again; a direct endpoint's connections are each
// sandbox's own, made only once the lifecycle server says the sandbox has
// not ended (without its answer, not made: provider.ErrUnavailable).
//
// Calls that fail with 408, 425, 429, 5xx (not 501) or a connection error
// are retried with jittered backoff (at least Retry-After). A lifecycle
// server that gives no answer is unreachable (provider.ErrUnavailable,
// Unreachable, Probe): while it is, a call is tried once. Errors come in the
// server's three shapes: {code, message}, FastAPI's 422 {detail: [...]}
// (a create refused so is provider.ErrInvalidSpec) and {detail: "..."}. A create or snapshot retried
// after a failure that may have taken effect first looks for what the first
// attempt made (by a token in its metadata or name), so nothing is made
// twice. A command is never sent twice: one whose stream ended without its
// final event is waited for through execd's status of it and answered
// provider.ErrUnavailable (its output may be cut anywhere); only the
// provider's own idempotent commands are run again. Creates and snapshots
// in flight are bounded; the rest queue in the client, so that the server's two capture
// workers are never handed more than they can finish before a deadline.
//
// A sandbox that is gone (deleted, its lease ran out, or its entrypoint
// ended: Terminated, Failed, as every one is after the runtime restarts) is
// reported as an error wrapping provider.ErrSandboxNotFound. A fork's labels
// are made its own (the runtime copies its source's into it); a snapshot a
// live fork was made from is refused for deletion with
// provider.ErrSnapshotInUse, at once.
package opensandbox
