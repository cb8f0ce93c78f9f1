package owner

import (
	"errors"
)

// Errors callers branch on.
var (
	// ErrConfig: the configuration is not usable.
	ErrConfig = errors.New("owner config")
	// ErrCheckpointingOff: a checkpoint operation on an owner without one.
	ErrCheckpointingOff = errors.New("checkpointing is off")
	// ErrCommitFailed: at least one session could not be snapshotted, or
	// the index refused the commit; nothing was recorded.
	ErrCommitFailed = errors.New("checkpoint commit failed")
	// ErrCommitStopped: StopCommit stopped the commit's writer (the
	// controller resumed); nothing of it is recorded.
	ErrCommitStopped = errors.New("checkpoint commit stopped by a resume")
	// ErrRestoreFailed: the restore installed nothing.
	ErrRestoreFailed = errors.New("checkpoint restore failed")
	// ErrInvalidRecord: a checkpoint record cannot be restored.
	ErrInvalidRecord = errors.New("invalid checkpoint record")
	// ErrUnknownCheckpoint: the index has no such checkpoint.
	ErrUnknownCheckpoint = errors.New("unknown checkpoint")
	// ErrClosed: the owner was closed.
	ErrClosed = errors.New("owner closed")
)
