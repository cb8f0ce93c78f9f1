package control

import (
	"math"
	"time"
)

// Phase is where the participant is in a checkpoint.
type Phase string

// Phases.
const (
	PhaseIdle      Phase = "idle"
	PhasePreparing Phase = "preparing"
	PhasePrepared  Phase = "prepared"
	PhaseCommitted Phase = "committed"
	PhaseRestored  Phase = "restored"
)

// Base is what every phased request carries.
type Base struct {
	CheckpointID string `json:"checkpoint_id"`
	// DeadlineTS is absolute, in Unix seconds of the machine's clock.
	DeadlineTS float64 `json:"deadline_ts"`
}

// Validate checks the id's grammar and that a deadline is given.
func (b Base) Validate() error {
	if err := ValidateCheckpointID("checkpoint_id", b.CheckpointID); err != nil {
		return err
	}
	if b.DeadlineTS <= 0 || math.IsNaN(b.DeadlineTS) || math.IsInf(b.DeadlineTS, 0) {
		return ErrInvalidRequest.With("deadline_ts must be a positive, finite Unix time in seconds")
	}
	return nil
}

// ValidateCheckpointID checks a checkpoint id's grammar; field names it in
// the error.
func ValidateCheckpointID(field, id string) error {
	if id == "" || len(id) > MaxIDLen || !idPattern.MatchString(id) {
		return ErrInvalidRequest.With("%s %q must be 1-%d characters matching %s", field, id, MaxIDLen, idPattern)
	}
	return nil
}

// Deadline is DeadlineTS as a time.
func (b Base) Deadline() time.Time { return FromUnixSeconds(b.DeadlineTS) }

// FromUnixSeconds converts a wire timestamp.
func FromUnixSeconds(ts float64) time.Time {
	sec, frac := math.Modf(ts)
	return time.Unix(int64(sec), int64(frac*1e9))
}

// UnixSeconds converts a time to a wire timestamp.
func UnixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// PrepareRequest asks the participant to get ready for a checkpoint.
type PrepareRequest struct {
	Base
}

// RenewRequest extends the lease of the active checkpoint.
type RenewRequest struct {
	Base
}

// ResumeRequest ends (or aborts) a checkpoint and reopens admission.
type ResumeRequest struct {
	Base
}

// CommitRequest cuts the checkpoint.
type CommitRequest struct {
	Base
	// CheckpointDir is the controller's directory; recorded with the
	// checkpoint, and restore can find the checkpoint by it.
	CheckpointDir string `json:"checkpoint_dir"`
	// EpisodeIDs is the scope the controller continues; nil means every
	// episode.
	EpisodeIDs []EpisodeID `json:"episode_ids,omitempty"`
	// Stop: the controller exits after this checkpoint.
	Stop bool `json:"stop,omitempty"`
}

// Validate checks the base, the directory and the episode ids.
func (r CommitRequest) Validate() error {
	if err := r.Base.Validate(); err != nil {
		return err
	}
	if r.CheckpointDir == "" {
		return ErrInvalidRequest.With("checkpoint_dir is required")
	}
	return validEpisodes(r.EpisodeIDs, false)
}

// RestoreRequest brings checkpointed episodes back in a fresh process.
type RestoreRequest struct {
	Base
	// CheckpointDir names the checkpoint committed with that directory
	// (upstream's controller); SourceCheckpointID names it directly. At
	// least one is required; with both, they must agree.
	CheckpointDir      string `json:"checkpoint_dir,omitempty"`
	SourceCheckpointID string `json:"source_checkpoint_id,omitempty"`
	// EpisodeIDs are the checkpointed attempts the controller continues;
	// each comes back under its next attempt.
	EpisodeIDs []EpisodeID `json:"episode_ids"`
}

// Validate checks the base, the source and the episode ids.
func (r RestoreRequest) Validate() error {
	if err := r.Base.Validate(); err != nil {
		return err
	}
	if r.CheckpointDir == "" && r.SourceCheckpointID == "" {
		return ErrInvalidRequest.With("checkpoint_dir or source_checkpoint_id is required")
	}
	if r.EpisodeIDs == nil {
		return ErrInvalidRequest.With("episode_ids is required")
	}
	return validEpisodes(r.EpisodeIDs, false)
}

// RetireRequest discards attempts.
type RetireRequest struct {
	Base
	EpisodeIDs []EpisodeID `json:"episode_ids"`
}

// Validate checks the base and that at least one valid episode is named.
func (r RetireRequest) Validate() error {
	if err := r.Base.Validate(); err != nil {
		return err
	}
	return validEpisodes(r.EpisodeIDs, true)
}

// ForgetRequest drops the retire marks of rollouts.
type ForgetRequest struct {
	Base
	RolloutIDs []string `json:"rollout_ids"`
}

// Validate checks the base and that at least one valid rollout is named.
func (r ForgetRequest) Validate() error {
	if err := r.Base.Validate(); err != nil {
		return err
	}
	if len(r.RolloutIDs) == 0 {
		return ErrInvalidRequest.With("rollout_ids needs at least one id")
	}
	for _, id := range r.RolloutIDs {
		if err := validRolloutID(id); err != nil {
			return err
		}
	}
	return nil
}

func validEpisodes(eps []EpisodeID, atLeastOne bool) error {
	if atLeastOne && len(eps) == 0 {
		return ErrInvalidRequest.With("episode_ids needs at least one episode")
	}
	for _, e := range eps {
		if err := e.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// Report is a prepare's readiness report.
type Report struct {
	Ready bool `json:"ready"`
	// Blockers are capture keys (at most MaxBlockers); BlockerCount is the
	// full count.
	Blockers     []string       `json:"blockers"`
	BlockerCount int            `json:"blocker_count"`
	Counts       map[string]int `json:"counts"`
	// Restarts are the in-flight episodes this participant cannot capture;
	// never capped.
	Restarts []string `json:"restarts"`
}

// MaxBlockers caps Report.Blockers.
const MaxBlockers = 100

// Manifest is what a commit recorded: the manifest it wrote under the
// checkpoint_dir, its keys in the file's (sorted) order.
type Manifest struct {
	CheckpointID  string `json:"checkpoint_id"`
	Instance      string `json:"instance,omitempty"`
	Kind          string `json:"kind,omitempty"`
	RecordCount   int    `json:"record_count"`
	RecordsFile   string `json:"records_file,omitempty"`
	RecordsSHA256 string `json:"records_sha256"`
	SchemaVersion int    `json:"schema_version,omitempty"`
}

// PrepareReply answers prepare.
type PrepareReply struct {
	Phase  Phase  `json:"phase"`
	Report Report `json:"report"`
}

// CommitReply answers commit.
type CommitReply struct {
	Phase    Phase    `json:"phase"`
	Manifest Manifest `json:"manifest"`
	// EpisodeIDs are the sorted capture keys of the exported records.
	EpisodeIDs []string `json:"episode_ids"`
	// Parked are the exported episodes a stop commit stopped.
	Parked []string `json:"parked,omitempty"`
}

// RestoreReply answers restore.
type RestoreReply struct {
	Phase              Phase  `json:"phase"`
	SourceCheckpointID string `json:"source_checkpoint_id"`
	// Restored are the sorted capture keys of the next attempts.
	Restored []string `json:"restored"`
}

// ResumeReply answers resume.
type ResumeReply struct {
	Phase      Phase `json:"phase"`
	Idempotent bool  `json:"idempotent"`
}

// RetireReply answers retire.
type RetireReply struct {
	Retired []string `json:"retired"`
}

// ForgetReply answers forget.
type ForgetReply struct {
	Forgotten []string `json:"forgotten"`
}

// RenewReply answers renew.
type RenewReply struct {
	LeaseExpiresAt float64 `json:"lease_expires_at"`
}

// Status answers status.
type Status struct {
	Kind            string   `json:"kind"`
	Instance        string   `json:"instance"`
	Phase           Phase    `json:"phase"`
	CheckpointID    *string  `json:"checkpoint_id"`
	LeaseExpiresAt  *float64 `json:"lease_expires_at"`
	RetiredRollouts int      `json:"retired_rollouts"`
	Retiring        int      `json:"retiring"`
	Report          Report   `json:"report"`
	Description
}

// Description is what the hooks add to status.
type Description struct {
	// Mode is the checkpoint mode in effect (exported, restart_only).
	Mode string `json:"mode"`
	// Verify is "wait" or "replay".
	Verify          string `json:"verify"`
	RetiredSessions int    `json:"retired_sessions"`
}

// Event is something the machine did on its own.
type Event struct {
	At           time.Time
	Kind         string // "lease_expired"
	CheckpointID string
}
