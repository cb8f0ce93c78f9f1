package control

import (
	"regexp"
	"slices"
	"strconv"
)

// idPattern is the grammar of checkpoint and rollout ids.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// attemptSuffix is what a capture key adds for attempts above 0; a rollout
// id may not end in it (with any digits), so ParseCaptureKey is exact.
var attemptSuffix = regexp.MustCompile(`-a([0-9]+)$`)

// MaxIDLen bounds checkpoint ids (as the checkpoint protocol does) and
// rollout ids (so that a path or a map key stays small).
const MaxIDLen = 128

// EpisodeID names one attempt of a rollout.
type EpisodeID struct {
	RolloutID string `json:"rollout_id"`
	Attempt   int    `json:"attempt"`
}

// CaptureKey is the rollout id for attempt 0, else "<rollout_id>-a<attempt>".
func (e EpisodeID) CaptureKey() string {
	if e.Attempt == 0 {
		return e.RolloutID
	}
	return e.RolloutID + "-a" + strconv.Itoa(e.Attempt)
}

// Next is the same rollout's next attempt.
func (e EpisodeID) Next() EpisodeID { return EpisodeID{RolloutID: e.RolloutID, Attempt: e.Attempt + 1} }

func (e EpisodeID) String() string { return e.CaptureKey() }

// Validate checks the rollout id's grammar (it must not itself look like a
// capture key of a later attempt, so the mapping stays invertible) and the
// attempt.
func (e EpisodeID) Validate() error {
	if err := validRolloutID(e.RolloutID); err != nil {
		return err
	}
	if e.Attempt < 0 {
		return ErrInvalidRequest.With("attempt must be >= 0, not %d", e.Attempt)
	}
	return nil
}

func validRolloutID(id string) error {
	if id == "" || len(id) > MaxIDLen || !idPattern.MatchString(id) {
		return ErrInvalidRequest.With("rollout_id %q must be 1-%d characters matching %s", id, MaxIDLen, idPattern)
	}
	if attemptSuffix.MatchString(id) {
		return ErrInvalidRequest.With("rollout_id %q must not end in -a<N>", id)
	}
	return nil
}

// ParseCaptureKey inverts CaptureKey. Only the canonical form is accepted:
// attempt 0 carries no suffix and attempts have no leading zeros.
func ParseCaptureKey(key string) (EpisodeID, error) {
	if loc := attemptSuffix.FindStringIndex(key); loc != nil {
		digits := key[loc[0]+2:]
		n, err := strconv.Atoi(digits)
		if err != nil || n == 0 || digits[0] == '0' {
			return EpisodeID{}, ErrInvalidRequest.With("capture key %q is not canonical (attempt 0 has no suffix, attempts no leading zeros)", key)
		}
		e := EpisodeID{RolloutID: key[:loc[0]], Attempt: n}
		if err := e.Validate(); err != nil {
			return EpisodeID{}, err
		}
		return e, nil
	}
	e := EpisodeID{RolloutID: key}
	if err := e.Validate(); err != nil {
		return EpisodeID{}, err
	}
	return e, nil
}

// CaptureKeys returns the sorted, de-duplicated capture keys of eps.
func CaptureKeys(eps []EpisodeID) []string {
	seen := make(map[string]bool, len(eps))
	out := make([]string, 0, len(eps))
	for _, e := range eps {
		k := e.CaptureKey()
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
