// Package timeouts names the wall-clock bounds the server puts on waits
// that no caller's context ends: background clean-ups, calls to actors
// that answer at once unless something is stuck, provider calls made on
// nobody's behalf. They are here, together, so that they are read and
// changed together; a wait a caller makes is bounded by the caller's
// context instead.
package timeouts

import "time"

const (
	// Reply bounds a wait for an actor that answers at once unless its
	// mailbox is stuck: the supervisor, a session's view, a restore's
	// installs. It guards against a lost reply, not a slow one.
	Reply = time.Minute
	// RoundSlack is how long past a snapshot round's deadline and drain
	// grace the owner waits for the round's result before calling it
	// lost.
	RoundSlack = time.Minute
	// Cleanup bounds a background clean-up of what no session holds: a
	// failed round's snapshots, a failed restore's forks and sessions,
	// superseded sandboxes.
	Cleanup = 10 * time.Minute
	// Listing bounds the provider listing a restore makes to find forks
	// whose call failed after the fork was made.
	Listing = time.Minute
	// CloseStops bounds the stops of the live sessions at a clean
	// shutdown; what is left then, the next start stops.
	CloseStops = 5 * time.Minute
	// ProviderCall bounds one provider call made on nobody's behalf: a
	// lease renewal, a direct-lending endpoint lookup.
	ProviderCall = time.Minute
	// Probe bounds the provider's reachability probe at start; a server
	// whose provider does not answer serves anyway and says so.
	Probe = 10 * time.Second
	// Abandon bounds the HTTP drain of a server dropped as a crash would
	// drop it (tests that restart one in the same process).
	Abandon = 10 * time.Second
	// RenewEvery is how often the owner renews its sandboxes' leases on
	// the wall clock.
	RenewEvery = 30 * time.Second
)
