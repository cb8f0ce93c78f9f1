// Package http serves a resources server and its checkpoint participant over
// fasthttp: the routes of NeMo Gym's SandboxOwnerResourcesServer, on the
// owner (package owner) and the phase machine (package control).
//
// # Routes
//
//	POST /seed_session        Resources.Seed (body: the dataset row)
//	POST /verify              Resources.Verify
//	POST /close_session       empty body: end the cookie's session → {"closed": true}
//	                          {resources_session_id, episode_id} → {resources_session_id}
//	POST /sandbox_access      the session's current sandbox (after a restore, the fork)
//	POST /<tool>              Resources.Tools, e.g. /append_note
//	GET  /health
//	/ng-rollout/<capture_key>/<route>   any of the above, bound to an episode
//	/ng-control/v1/checkpoint/{status,prepare,commit,restore,resume,retire,forget,renew,release}
//	                          only with checkpointing on; Authorization: Bearer <token>
//
// Every error is {"error":{"code","detail"}}: the protocol's codes and
// statuses (problem.Error), 409 no_session_sandbox, 404 no_sandbox_access,
// 413 body_too_large, 422 invalid_request for malformed JSON or wrong types,
// 500 internal_error for a panic (the server lives on). Control bodies refuse
// unknown fields; data bodies ignore them, as dataset rows carry many.
//
// # Sessions and episodes
//
// A session is a signed cookie named <kind>___<name> whose value is the
// session id and an HMAC-SHA256 of it (Signer). A missing, forged or tampered
// cookie starts a new session. The secret comes from the config or is
// generated once into checkpoint.state_dir (LoadSessionSecret), so cookies
// survive a restart and a controller can re-seed a restored session with the
// cookie it already holds.
//
// A 2xx seed under a rollout prefix binds the session to the prefix's
// episode {rollout_id, attempt}; a 2xx verify or close ends the binding. A
// restore binds each restored session to its episode's next attempt, so the
// controller's re-seed under /ng-rollout/<rollout>-a<n+1>/seed_session with
// the same cookie gets the fork (owner.StartSessionSandbox hands it back with
// Restored set and does not run setup again).
//
// # Admission
//
// With checkpointing on, data requests pass the admission gate
// (control.Gate): while a checkpoint is open they wait (in restart_only mode
// only seeds do; a replayable verify never does), the admitted ones are
// counted per session so a prepare is ready when none is in flight, and a
// request of a retired attempt is refused with 409 stale_attempt until the
// rollout is forgotten (/close_session is never refused). Seed replies carry
// x-ng-checkpoint-verify (wait or replay) and, in restart_only mode,
// x-ng-checkpoint-restart: 1.
//
// # Concurrency
//
// fasthttp reuses a request's memory after the handler returns, so bodies are
// copied before they reach a Resources method, and every request gets its own
// context (a RequestCtx is done only at server shutdown). Shutdown stops
// accepting, lets gate waiters go with 503, and waits for the requests in
// flight; the caller then closes the owner.
package http
