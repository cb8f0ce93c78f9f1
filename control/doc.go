// Package control is the participant side of NeMo Gym's partial-rollout
// checkpoint protocol, as plain Go state: the phase machine, the admission
// gate, episode ids and the protocol's errors.
//
// The decisions are state.Step: every route, the lease's tick and every
// hook's completion is an input; Step returns the reply and the effects
// (close or open admission, run a hook, retire, notify, log) and holds no
// lock, goroutine or timer. Machine is the thin shell around it: it
// serialises steps, performs their effects, runs a commit or restore hook
// once per id (single flight) and waits on the injected clock. The scripted
// tests in testdata/step drive state alone. It knows nothing of HTTP or of
// sandboxes; package http serves it under /ng-control/v1/checkpoint/ and
// implements its Hooks with the owner, and the simulation drives it directly
// with a clock.Manual.
//
// # Phases
//
//	idle → preparing → prepared → committed      (prepare, commit)
//	idle → restored                              (restore)
//	{preparing, prepared, committed, restored} → idle   (resume, or the lease)
//
// At most one checkpoint id is active. Every phased operation is admitted in
// this order: an id among the last 64 resumed is stale_checkpoint; another
// active id is checkpoint_conflict; a recorded reply for (id, operation) is
// returned as it was (a retry with other arguments is checkpoint_conflict);
// a phase the operation does not allow is invalid_phase. Retire and forget
// skip the resumed-id check: a controller retires stragglers after aborting a
// prepare with resume, under that same id.
//
// Prepare closes admission (Hooks.CloseAdmission) and then waits until the hooks report ready or its deadline passes; a prepare past
// its deadline answers phase "preparing" with its blockers and leaves
// admission closed until a resume. The wait is woken by Notify (the gate calls
// it when requests finish) and polls at least every PollEvery.
//
// Commit and restore run their hook once per checkpoint id in a goroutine
// shielded from the caller's deadline: a deadline fails the call with
// deadline_exceeded while the hook keeps going, and a retry awaits the same
// run instead of starting another. Resume waits for such a run before it
// reopens, so no checkpoint is published after a resume returns.
//
// # Lease
//
// Prepare, commit, restore, retire in restored and renew move the lease to
// max(lease, deadline_ts + LeaseGrace). Tick, called by a ticker in the
// server or by the simulation with logical time, reopens exactly as a resume
// would once the lease has passed and records a lease_expired Event. Every
// operation calls Tick first, so an expired lease is never acted on.
//
// # Retire fencing
//
// Retire marks, per rollout, every attempt up to the highest retired one as
// refused (Fenced), then asks the hooks to stop their work. The marks last
// until forget. The server answers a fenced episode's requests with
// stale_attempt.
//
// # Admission gate
//
// Gate is the data-plane half: requests wait while it is closed, those
// admitted are counted per session, WaitIdle lets a retire wait for a
// session's requests to finish, and Shutdown releases every waiter.
package control
