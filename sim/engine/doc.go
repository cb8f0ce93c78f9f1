// Package engine is the deterministic simulation of the sandbox owner:
// `go run ./sim` drives it, and its tests replay a fixed regression set.
//
// A run drives the real owner (owner.New: actors, coordinator, snapshot
// index) over one fake provider that outlives owner crashes. Its workload is
// the notes server's: seed (a setup that writes .seed_token and returns it
// as session data), append notes, verify (notes equal and tokens agree →
// 1.0, then the session ends), close, commit (with and without stop),
// recommit, restore (after a crash, or in place), retire, release, time
// passing, and checkpoints through the control plane (the participant's Step
// machine over the same owner: prepare, commit and resume with an agent's
// exec held at the gate; a lease that runs out; a retire that fences an
// episode; a restore by checkpoint_dir after a crash), and agents' execs
// through the sandbox API in sandboxes current and stale. A model says what
// each session and checkpoint holds; after every step the invariants are
// checked against the real state: the owner's sessions, its index (or, after
// a crash, the index opened again) and the fake's sandboxes, snapshots and
// files.
//
// # Runtimes
//
// RuntimeDeterministic (the default) runs everything concurrent on one
// sched.Det seeded by the run: the actors' mailboxes, the sessions'
// effects, the owner's fan-outs and waits, the control plane's hook runs and
// gate, the fake's hangs and the harness's own raced calls take turns one at
// a time in an order drawn from the seed, on virtual time that moves only
// when nothing can run (to the next timer) or when a step moves it. The
// index is a snapshotindex.Memory (its contents survive a crash as a disk's
// would), and a worker's runs share one protoactor system. So a seed is one
// run: the same trace, byte for byte, every time.
//
// RuntimeReal runs the owner as the server does: goroutines, Badger on a
// temporary state_dir, wall-clock waits beside the manual clock. A seed then
// replays its steps, faults and incarnation ids, but the Go scheduler
// decides how raced operations interleave. The OpenSandbox provider (HTTP)
// runs only in this mode.
//
// Each step draws from its own stream (seed, step), so that a different
// outcome in one step does not shift the next ones.
//
// Every step has one shape: choose (every draw from the step's stream,
// into a plan), arm (the plan's faults on the fake and the crash trigger;
// append, recommit and agent-exec arm none), act (the owner's call, and
// its trace line), check (what the owner answered, against the model). A
// restore draws its checkpoint and scope before the crash that precedes
// it, and the rest after; a raced commit (seed and end against a commit)
// acts all three at once.
//
// A crash is modelled by a per-incarnation view of the fake (process): from
// the moment the owner dies no call of it reaches the backend, and calls in
// flight never return their result to it, so that the abandoned owner's
// goroutines (which the simulation cannot kill) cannot act after the crash.
// Crash triggers fire before or after the n-th call of an op (mid-seed,
// after k of n snapshots, before the index transaction, mid-park, after k of
// n forks, between tombstones and deletes, mid-end).
package engine
