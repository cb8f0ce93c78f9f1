// Package fake is an in-memory sandbox provider that injects faults, for the
// owner's tests, the simulation and the benchmarks.
//
// A *Provider implements provider.Provider, Snapshotter, Leaser and Lister;
// NewWithoutSnapshots gives one that implements only Provider and Lister, for
// the restart-only path. The fake is a plain value with no goroutines of its
// own: share one between an old owner and a fresh one to model a backend that
// outlives a crashed process.
//
//	fk := fake.New(fake.Options{Clock: clk, Seed: 1})
//	o1 := owner.New(fk, ...)  // commit, then drop o1 without shutdown
//	o2 := owner.New(fk, ...)  // restore forks from fk's snapshots
//	if n := fk.Stats().LiveSnapshots; n != want { ... }
//
// # Sandboxes
//
// A sandbox is a map from absolute path to contents. Start writes spec.Files
// into it (relative paths under the workdir, default DefaultWorkdir). Ids are
// counters, "<IDPrefix>sb-<N>" and "<IDPrefix>snap-<N>", so a test can predict
// them. Snapshot copies the files; Fork starts from a copy of them (spec.Files
// are ignored, as provider.Snapshotter says), so a fork and its original never
// share state. A snapshot a live fork stands on cannot be deleted:
// DeleteSnapshot answers provider.ErrSnapshotInUse until the fork is stopped
// or its lease runs out, as OpenSandbox answers SNAPSHOT::DELETE_CONFLICT.
// Paths that climb above "/" are refused with provider.ErrPathEscape.
//
// Exec interprets one simple command: pwd, cat FILE..., ls [DIR], echo
// [-n] ARGS, true, false, exit [N], test -f FILE, each with an optional
// "> FILE" or ">> FILE", words split on blanks with single and double quotes. Any
// other command exits 127 with a stderr naming what the fake understands;
// pipes, lists, expansions and globs exit 2. Env and Timeout are ignored.
//
// # Leases
//
// A spec with a TTL gets ExpiresAt = Clock.Now()+TTL; Renew moves it. Expiry
// is lazy: the first call or inspection that looks at an expired sandbox
// deletes it (Stats.Reaped), and Reap deletes all expired ones at once. Use a
// clock.Manual and Advance it; nothing in the fake reads the wall clock
// except latency.
//
// # Latency and faults
//
// SetLatency and SetLatencyRange (seeded by Options.Seed) delay an op; the
// delay ends early when the call's context does. Faults, each consumed by one
// call, chosen in this order: HangNext (block until the context ends, no
// effect), FailNextFor (one sandbox or snapshot), FailNext,
// FailWithProbability (seeded), FailAfterEffect (the effect happens, the call
// still fails and returns no id). Injected errors wrap provider.ErrInjected
// and name the op and sandbox.
//
// # Observing calls
//
// Stats counts calls, failures, consumed faults and in-flight and peak
// concurrent calls per op, plus live sandboxes and snapshots. SetHook runs a
// function outside the lock at the begin and end of every call; blocking in
// it holds calls in flight, which is how a test checks a concurrency bound
// without sleeping:
//
//	entered, release := make(chan struct{}), make(chan struct{})
//	fk.SetHook(func(c fake.Call) {
//		if c.Op == fake.OpSnapshot && c.Phase == fake.PhaseBegin {
//			entered <- struct{}{}
//			<-release
//		}
//	})
//
// Files, SnapshotFiles, Sandbox, SnapshotInfo, LiveSandboxIDs and SnapshotIDs
// inspect state without counting as calls.
package fake
