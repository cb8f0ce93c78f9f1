package owner

import (
	"fmt"
)

// retiring is a retire's decisions: take the control turn (a wait its
// caller's context bounds, so a deadline ends a wait behind a running
// release), stop the sessions' sandboxes with their snapshots kept, give
// the turn back, and fail if any could not be stopped: those sessions stay,
// so that a retry stops them.
type retiring struct {
	sessions []string
	phase    retirePhase
	res      RetireResult
}

// retirePhase is what the machine waits for.
type retirePhase int

const (
	rtStart retirePhase = iota
	rtTurn
	rtStopped
	rtDone
)

var retirePhases = [...]string{"start", "turn", "stopped", "done"}

func (p retirePhase) String() string { return retirePhases[p] }

// Effects of a retire.
type (
	// effTakeTurn waits for the control turn (commit, restore, retire,
	// release and the retention checks run one at a time): inTurn.
	effTakeTurn struct{}
	// effGiveTurn gives the control turn back.
	effGiveTurn struct{}
	// effRetire stops the sessions' sandboxes, keeping their snapshots
	// (at most parallelism at once): inStopped.
	effRetire struct{ Sessions []string }
)

// inTurn: the control turn is taken, or the wait for it ended with Err.
type inTurn struct{ Err error }

func (effTakeTurn) String() string            { return "take the control turn" }
func (effGiveTurn) String() string            { return "give the control turn back" }
func (e effRetire) String() string            { return "retire " + bracket(e.Sessions) }
func newRetiring(sessions []string) *retiring { return &retiring{sessions: sessions} }

func (m *retiring) step(in input) []effect {
	switch in := in.(type) {
	case inStart:
		m.phase = rtTurn
		return []effect{effTakeTurn{}}
	case inTurn:
		if in.Err != nil {
			m.phase = rtDone
			return []effect{effDone{Err: fmt.Errorf("retire: waiting for another control operation: %w", in.Err)}}
		}
		m.phase = rtStopped
		return []effect{effRetire{Sessions: m.sessions}}
	case inStopped:
		m.phase = rtDone
		m.res = RetireResult(in)
		if len(in.Failed) > 0 {
			return []effect{effGiveTurn{}, effDone{Err: fmt.Errorf("retire: %d of %d sessions could not be stopped", len(in.Failed), len(m.sessions))}}
		}
		return []effect{effGiveTurn{}, effDone{}}
	}
	panic(fmt.Sprintf("owner: retire waiting for %s got %T", m.phase, in))
}
