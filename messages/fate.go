package messages

// Fate is what became of a sandbox a session held: the owner remembers it,
// and the sandbox API answers an agent's stale sandbox id by it.
type Fate string

// Fates.
const (
	// FateUnknown: no session held the sandbox (or it was forgotten).
	FateUnknown Fate = "unknown"
	// FateLive: the sandbox is its session's current one.
	FateLive Fate = "live"
	// FateSuperseded: a restore replaced it with a fork.
	FateSuperseded Fate = "superseded"
	// FateEnded: its session ended.
	FateEnded Fate = "ended"
)
