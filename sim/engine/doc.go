// Package engine is the deterministic simulation of the sandbox owner (issue
// 5): `go run ./sim` drives it, and its tests replay a fixed regression set.
//
// A run drives the real owner (owner.New: actors, coordinator, Badger index in
// a temporary state_dir) over one fake provider that outlives owner crashes,
// with logical time from a clock.Manual (leases renewed by owner.Tick, reaped
// by the fake's Reap). Its workload is the notes server's: seed (a setup that
// writes .seed_token and returns it as session data), append notes, verify
// (notes equal and tokens agree → 1.0, then the session ends), close, commit
// (with and without stop), recommit, restore (after a crash, or in place),
// retire, release, time passing, and checkpoints through the control plane
// (the participant's Step machine over the same owner: prepare, commit and
// resume; a lease that runs out; a retire that fences an episode). A model says what each session and
// checkpoint holds; after every step the invariants are checked against the
// real state: the owner's sessions, its index (or, after a crash, the index
// opened on disk) and the fake's sandboxes, snapshots and files.
//
// One seed replays one run. Each step draws from its own stream
// (seed, step), so that a different outcome in one step does not shift the
// next ones; steps run one at a time, and where they race on purpose (a seed
// and an end racing a commit) the model accepts either order.
//
// A crash is modelled by a per-incarnation view of the fake (process): from
// the moment the owner dies no call of it reaches the backend, and calls in
// flight never return their result to it, so that the abandoned owner's
// goroutines (which the simulation cannot kill) cannot act after the crash.
// Crash triggers fire before or after the n-th call of an op (mid-seed,
// after k of n snapshots, before the index transaction, mid-park, after k of
// n forks, between tombstones and deletes, mid-end).
package engine
