package owner

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/snapshotindex"
)

// The owner's checkpoint operations are machines: a machine's step takes
// an input (the outcome of the last read or write) and returns effects,
// holding no lock, goroutine, index or provider. The shell (perform, run)
// does each effect in order; the one that reads or writes something gives
// the machine its next input. The scripts under testdata/ drive the
// machines alone.

// effect is one thing a machine asks the shell to do.
type effect interface{ String() string }

// input is what the shell tells a machine: inStart first, then the outcome
// of the effect that asked for it.
type input any

// machine is an operation's decisions.
type machine interface{ step(in input) []effect }

// Effects whose outcome is the machine's next input.
type (
	// effReadCheckpoints reads the committed checkpoints: inCheckpoints.
	effReadCheckpoints struct{}
	// effReadRefs reads which checkpoints name each snapshot: inRefs.
	effReadRefs struct{}
	// effReadTombstones reads the tombstones: inTombstones.
	effReadTombstones struct{}
	// effCheckKept looks each kept checkpoint up in the index: inKept.
	effCheckKept struct{ IDs []string }
	// effListSnapshots lists the provider's snapshots: inSnapshots.
	effListSnapshots struct{}
	// effDrop drops checkpoints from the index and tombstones snapshots,
	// in one transaction: inWritten.
	effDrop struct {
		IDs, Tombstones []string
		Reason          string
	}
	// effTombstone tombstones snapshots, clearing intents in the same
	// transaction: inWritten.
	effTombstone struct {
		IDs    []string
		Reason string
		Clear  []snapshotindex.IntentKey
	}
	// effDelete deletes snapshots from the provider (at most parallelism
	// at once): inDeleted.
	effDelete struct{ IDs []string }
)

// Effects with no input.
type (
	// effClear clears the tombstones of deleted snapshots; a failure is
	// logged (the tombstones stay, and a later release deletes again).
	effClear struct{ IDs []string }
	// effCountDrops counts checkpoints dropped, by reason.
	effCountDrops struct {
		Reason string
		N      int
	}
	// effLog logs a line.
	effLog struct {
		Level  logrus.Level
		Msg    string
		Fields logrus.Fields
	}
	// effDone ends the operation.
	effDone struct{ Err error }
)

// Inputs.
type (
	inStart       struct{}
	inCheckpoints struct {
		All []snapshotindex.CheckpointMeta
		Err error
	}
	inRefs struct {
		Refs map[string][]string
		Err  error
	}
	inTombstones struct {
		IDs []string
		Err error
	}
	// inKept names the first kept checkpoint the index could not give.
	inKept struct {
		Missing string
		Err     error
	}
	inSnapshots struct {
		Snaps []provider.SnapshotInfo
		Err   error
	}
	inWritten struct{ Err error }
	// inDeleted: the snapshots deleted, those a live fork still stands on
	// (the provider refused them as in use: pending, not failed), and the
	// failures.
	inDeleted struct {
		Deleted, InUse []string
		Failed         map[string]string
	}
)

func bracket(ids []string) string { return "[" + strings.Join(ids, ",") + "]" }

func (effReadCheckpoints) String() string { return "read checkpoints" }
func (effReadRefs) String() string        { return "read refs" }
func (effReadTombstones) String() string  { return "read tombstones" }
func (e effCheckKept) String() string     { return "check kept " + bracket(e.IDs) }
func (effListSnapshots) String() string   { return "list snapshots" }
func (e effDrop) String() string {
	return fmt.Sprintf("drop %s tombstone %s (%s)", bracket(e.IDs), bracket(e.Tombstones), e.Reason)
}
func (e effTombstone) String() string {
	s := fmt.Sprintf("tombstone %s (%s)", bracket(e.IDs), e.Reason)
	for _, k := range e.Clear {
		s += " clearing intent " + k.Kind + " " + k.ID
	}
	return s
}
func (e effDelete) String() string     { return "delete " + bracket(e.IDs) }
func (e effClear) String() string      { return "clear tombstones " + bracket(e.IDs) }
func (e effCountDrops) String() string { return fmt.Sprintf("count %d %s", e.N, e.Reason) }
func (e effLog) String() string {
	var fs []string
	for _, k := range slices.Sorted(maps.Keys(e.Fields)) {
		fs = append(fs, fmt.Sprintf(" %s=%v", k, e.Fields[k]))
	}
	return fmt.Sprintf("log %s %q%s", e.Level, e.Msg, strings.Join(fs, ""))
}
func (e effDone) String() string {
	if e.Err != nil {
		return "done: " + e.Err.Error()
	}
	return "done"
}

func sortedKeys(m map[string]bool) []string { return slices.Sorted(maps.Keys(m)) }

func logAt(level logrus.Level, msg string, fields logrus.Fields) effLog {
	return effLog{Level: level, Msg: msg, Fields: fields}
}

// afterDelete is what follows a delete: the deleted snapshots' tombstones
// cleared, and a line for those that failed or are in use.
func afterDelete(in inDeleted) []effect {
	var out []effect
	if len(in.Deleted) > 0 {
		out = append(out, effClear{IDs: in.Deleted})
	}
	if len(in.Failed) > 0 {
		out = append(out, logAt(logrus.WarnLevel, "some snapshots could not be deleted; their tombstones stay", logrus.Fields{"failed": len(in.Failed)}))
	}
	if len(in.InUse) > 0 {
		out = append(out, logAt(logrus.InfoLevel, "some snapshots are still in use by a sandbox forked from them; their deletes are pending", logrus.Fields{"in_use": len(in.InUse)}))
	}
	return out
}
