package owner

import (
	"errors"
	"fmt"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/sandbox"
)

// maxSeedAttempts bounds how many times a seed asks again after finding
// the session's actor on its way out.
const maxSeedAttempts = 101

// seeding is a seed's decisions: ask the supervisor for the session's
// actor (a new one, within the capacity) with the start, which the
// supervisor hands to that actor, to start the sandbox and run setup. An
// actor found on its way out (its session just ended) is forgotten and the
// supervisor asked again; a failed start of an actor this seed spawned
// forgets it, and waits for the supervisor to have done so, so that nothing
// is tracked for it.
type seeding struct {
	sessionID string
	limit     int
	// start is the request to the actor (its reply slot set by the shell).
	start   messages.StartSandbox
	attempt int
	ref     *messages.SessionRef
	phase   seedPhase
	sb      sandbox.Sandbox
	// out holds the effects of a step: the shell performs them before the
	// next step, which reuses it (a slice of each step's own was two of a
	// seed's allocations).
	out [2]effect
}

// seedPhase is what the machine waits for.
type seedPhase int

const (
	sdStart seedPhase = iota
	sdStarted
	sdDone
)

var seedPhases = [...]string{"start", "started", "done"}

func (p seedPhase) String() string { return seedPhases[p] }

// Effects of a seed.
type (
	// effSpawnStart asks the supervisor for the session's actor, a new one
	// only if fewer than Limit sessions exist (0: no bound), and has it
	// hand Msg to that actor: inStartReply.
	effSpawnStart struct {
		SessionID string
		Limit     int
		Msg       messages.StartSandbox
	}
	// effForget tells the supervisor to forget the session's actor PID.
	effForget struct {
		SessionID string
		PID       any
	}
)

// Inputs of a seed.
type (
	// inStartReply: Ref is the actor the supervisor handed the start to
	// (PID nil and Err set when it refused: at capacity), Rep that actor's
	// answer; Err an ask that got no answer, or reached no actor.
	inStartReply struct {
		Ref *messages.SessionRef
		Rep *messages.StartReply
		Err error
	}
)

func (e effSpawnStart) String() string {
	return fmt.Sprintf("spawn %s (limit %d) and start its sandbox", e.SessionID, e.Limit)
}
func (e effForget) String() string { return fmt.Sprintf("forget %s on %v", e.SessionID, e.PID) }

func newSeeding(sessionID string, limit int, start messages.StartSandbox) *seeding {
	return &seeding{sessionID: sessionID, limit: limit, start: start}
}

func (m *seeding) step(in input) []effect {
	switch in := in.(type) {
	case inStart:
		return m.spawn()
	case inStartReply:
		m.ref = in.Ref
		err := in.Err
		if err == nil && in.Ref != nil {
			err = in.Ref.Err
		}
		if err == nil && in.Rep != nil {
			err = in.Rep.Err
		}
		if m.ref == nil || m.ref.PID == nil {
			// No actor was asked: the supervisor refused, or never
			// answered.
			return m.done(err)
		}
		// An actor that stopped before the start reached it (its session
		// ended and its grace passed) is on its way out as much as one
		// that answers ended.
		if (errors.Is(err, actors.ErrSessionEnded) || gone(err)) && m.attempt < maxSeedAttempts {
			// The actor is on its way out: forget it and ask again.
			return append([]effect{effForget{SessionID: m.sessionID, PID: m.ref.PID}}, m.spawn()...)
		}
		if in.Err != nil {
			return m.done(in.Err)
		}
		if err != nil {
			if m.ref.Spawned && !errors.Is(err, sandbox.ErrExists) {
				// Nothing is tracked for a failed start: drop the empty
				// actor.
				return append([]effect{effForget{SessionID: m.sessionID, PID: m.ref.PID}}, m.done(err)...)
			}
			return m.done(err)
		}
		m.sb = in.Rep.Sandbox
		return m.done(nil)
	}
	panic(fmt.Sprintf("owner: seed waiting for %s got %T", m.phase, in))
}

func (m *seeding) spawn() []effect {
	m.attempt++
	m.phase = sdStarted
	return append(m.out[:0], effSpawnStart{SessionID: m.sessionID, Limit: m.limit, Msg: m.start})
}

func (m *seeding) done(err error) []effect {
	m.phase = sdDone
	if err == nil {
		// A zero effDone is boxed without an allocation.
		return append(m.out[:0], effDone{})
	}
	return append(m.out[:0], effDone{Err: err})
}
