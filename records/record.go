package records

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"time"

	"github.com/sandboxowner/owner/provider"
)

// Record is a resources server's record of one session, as Gym's
// resources participant writes it: the episode, the session, the state a
// restore needs with no local state, and the routing owner (none here).
type Record struct {
	EpisodeID *EpisodeID `json:"episode_id"`
	SessionID string     `json:"session_id"`
	State     State      `json:"state"`
	Owner     *string    `json:"owner"`
}

// EpisodeID is Gym's episode id.
type EpisodeID struct {
	RolloutID string `json:"rollout_id"`
	Attempt   int    `json:"attempt"`
}

// State is a session's exported state: its sandbox's checkpoint state, the
// workdir and the resources server's session data.
type State struct {
	Sandbox SandboxState    `json:"sandbox"`
	Workdir string          `json:"workdir"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// SandboxState is Gym's sandbox checkpoint state: the snapshot to fork
// from, the spec to fork it with (no files: they are in the snapshot), and
// the sandbox it was taken from, which a restore stops.
type SandboxState struct {
	ProviderName string          `json:"provider_name"`
	Descriptor   provider.Handle `json:"descriptor"`
	SnapshotID   string          `json:"snapshot_id"`
	Spec         provider.Spec   `json:"spec"`
	// SnapshotAt is Unix seconds, to the microsecond, so that a time read
	// back writes the same number again.
	SnapshotAt float64 `json:"snapshot_at"`
}

// attemptSuffix is what a capture key adds for attempts above 0.
var attemptSuffix = regexp.MustCompile(`-a([0-9]+)$`)

// EpisodeOf is the episode a capture key names ("<rollout>" for attempt 0,
// "<rollout>-a<N>" for N); nil for "".
func EpisodeOf(captureKey string) *EpisodeID {
	if captureKey == "" {
		return nil
	}
	if loc := attemptSuffix.FindStringSubmatchIndex(captureKey); loc != nil {
		if n, err := strconv.Atoi(captureKey[loc[2]:loc[3]]); err == nil {
			return &EpisodeID{RolloutID: captureKey[:loc[0]], Attempt: n}
		}
	}
	return &EpisodeID{RolloutID: captureKey}
}

// CaptureKey is the episode's capture key ("" for nil).
func (e *EpisodeID) CaptureKey() string {
	switch {
	case e == nil:
		return ""
	case e.Attempt == 0:
		return e.RolloutID
	default:
		return e.RolloutID + "-a" + strconv.Itoa(e.Attempt)
	}
}

// UnixSeconds is t as SnapshotAt holds it.
func UnixSeconds(t time.Time) float64 { return float64(t.UnixMicro()) / 1e6 }

// TimeOf inverts UnixSeconds.
func TimeOf(seconds float64) time.Time {
	return time.UnixMicro(int64(math.Round(seconds * 1e6))).UTC()
}

// Line is r as one records-file line.
func (r Record) Line() ([]byte, error) {
	line, err := marshalPython(r)
	if err != nil {
		return nil, fmt.Errorf("%w: record of session %q is not JSON: %v", ErrInvalidState, r.SessionID, err)
	}
	return line, nil
}

// ParseRecord reads one records-file line as a resources record.
func ParseRecord(line []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(line, &r); err != nil {
		return r, fmt.Errorf("%w: a record is not a resources record: %v", ErrInvalidState, err)
	}
	if r.SessionID == "" || r.State.Sandbox.SnapshotID == "" || r.State.Sandbox.ProviderName == "" {
		return r, fmt.Errorf("%w: the record of session %q lacks its session, snapshot or provider", ErrInvalidState, r.SessionID)
	}
	// The session data as the server wrote it, not as the file spaces it.
	if len(r.State.Data) > 0 {
		var buf bytes.Buffer
		if err := json.Compact(&buf, r.State.Data); err != nil {
			return r, fmt.Errorf("%w: the data of session %q: %v", ErrInvalidState, r.SessionID, err)
		}
		r.State.Data = buf.Bytes()
	}
	return r, nil
}
