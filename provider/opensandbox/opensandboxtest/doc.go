// Package opensandboxtest is a fake OpenSandbox server for tests, in the
// manner of net/http/httptest: NewServer serves the lifecycle API (under /v1)
// and every sandbox's execd on one loopback listener, written from
// OpenSandbox's OpenAPI specs (specs/sandbox-lifecycle.yml and
// specs/execd-api.yaml in github.com/alibaba/OpenSandbox).
//
// What it keeps of the real server's contract:
//   - Create, snapshot: 202, then the client polls. A sandbox is Pending for
//     Options.CreateLatency, then Running (or Failed, see FailNextCreates).
//     A snapshot is Creating, then Ready (or Failed); at most
//     Options.CaptureWorkers (default 2, as upstream) captures run at once,
//     and later requests queue behind them.
//   - Non-2xx answers come in the real server's three shapes: its own
//     {"code","message"} (codes of its Docker runtime), FastAPI's 422
//     {"detail":[...]} for a request that fails validation, and
//     {"detail":"Not Found"} for an unknown route.
//   - What the real server does that the spec does not say (the lifecycle
//     contract suite runs against both): creates answer already Running;
//     a snapshot's source is Paused while captured; a fork inherits its
//     source's metadata and env; deleting a snapshot a live fork stands on
//     is 409 SNAPSHOT::DELETE_CONFLICT and leaves it Deleting; an
//     entrypoint that exits leaves the sandbox Terminated or Failed
//     (Terminate does so to all, as a runtime restart); pause twice 500;
//     lists newest first, filtered by metadata on the server.
//   - OPEN-SANDBOX-API-KEY is required when Options.APIKey is set (401
//     MISSING_API_KEY, INVALID_API_KEY).
//   - A sandbox created with a timeout has an absolute expiresAt and is
//     deleted once Options.Clock passes it; renew-expiration moves it (an
//     ended sandbox's too) and is refused (409) for a sandbox created
//     without one.
//   - Deleting a snapshot that is still Creating is refused (409).
//   - Endpoints have no scheme and carry a path prefix, and name no headers,
//     as under the Docker runtime (unless Options.ExecdHeaders names some:
//     then execd requires them). The server-proxy form is
//     /sandboxes/{id}/proxy/{port}, without /v1; it takes no API key
//     (unless Options.ProxyNeedsAPIKey). A direct endpoint is a host port:
//     Reassign gives one sandbox's to another's execd, as a runtime that
//     restarts may.
//   - execd's access token: a sandbox created with EXECD_ACCESS_TOKEN in
//     its env (a fork inherits its source's unless its create names one)
//     has an execd that wants it in X-EXECD-ACCESS-TOKEN on every route,
//     /ping included, and refuses a call without it, or with another, 401
//     {"error": "Unauthorized: invalid or missing header ..."}, as the real
//     execd does. A token in Options.ExecdHeaders is one the runtime gave
//     execd itself, by the flag that wins over the env's.
//   - States are spelled as the spec does, or in lower case
//     (Options.LowerCaseStates), since servers disagree.
//   - execd: POST /command answers a stream of raw JSON frames (no "data:"
//     prefix), framed as the real execd frames them (checked against it by
//     the provider's contract suite): one event per output line without its
//     ending, "\n" for an empty line, "\r" ending a line too, a killing
//     signal or timeout as evalue -1; a missing cwd is 400
//     INVALID_REQUEST_BODY; DELETE /command?id= interrupts a command;
//     GET /command/status/{id} says whether it runs and how it ended
//     (CutNextCommandStreams ends streams early, as execd may);
//     /files/upload takes multipart metadata/file pairs, /files/download,
//     /ping. Like the real execd, it expands $NAME and ${NAME} in paths
//     and cwd (HOME is /root; an undefined name is refused).
//
// Every request is checked against the spec's schema: required fields,
// types, and unknown fields where the spec forbids them are refused with 400
// as the real server does; every departure from the spec (including unknown
// fields where the spec merely allows them) is also recorded, and a test
// asserts Violations() is empty after driving the client.
//
// State changes are computed from Options.Clock when a request looks, not by
// timers, so a test on a clock.Manual is deterministic. The sandboxes' files
// and commands are a Backend's (by default the in-memory fake provider), and
// so are their ids, labels and leases: a snapshot is the backend's snapshot
// of the files, never the processes, as upstream keeps the rootfs only.
// With Options.SyncWithBackend the backend is the runtime of record (the
// simulation injects its faults there).
//
// cmd/fakeopensandbox runs the server on its own.
package opensandboxtest
