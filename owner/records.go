package owner

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/sandboxowner/owner/records"
	"github.com/sandboxowner/owner/snapshotindex"
)

// The controller's checkpoint_dir holds what a restore needs: each commit
// writes this server's records and manifest there (kind resources, the
// server's name as instance), and a restore reads them, so a server on
// another machine with an empty state_dir restores from them alone. The
// index in state_dir is this process's cache of them (and the book of
// tombstones and intents).

// recordsWriter writes this server's records.
func (o *Owner) recordsWriter() records.Writer {
	fsys := o.cfg.Checkpoint.Records
	if fsys == nil {
		fsys = records.OS{}
	}
	return records.Writer{FS: fsys, Participant: o.participant()}
}

func (o *Owner) participant() records.Participant {
	return records.Participant{Kind: records.KindResources, Instance: o.name}
}

// checkInstance refuses a server name that cannot name its records'
// directory.
func checkInstance(name string) error {
	if _, err := (records.Participant{Kind: records.KindResources, Instance: name}).Dir("/"); err != nil {
		return fmt.Errorf("%w: name %q cannot name a checkpoint directory (want letters, digits, '.', '_', '-', not first): %w", ErrConfig, name, err)
	}
	return nil
}

// publishRecords writes the checkpoint's records, in session order, and
// their manifest under dir. Writing the same records again returns the
// manifest already there, so a retried commit stores what the first one
// cut. No dir (a caller below the control plane) writes nothing.
func (o *Owner) publishRecords(checkpointID, dir string, recs []snapshotindex.Record) (records.Manifest, error) {
	if dir == "" {
		return records.Manifest{}, nil
	}
	sorted := slices.SortedFunc(slices.Values(recs), func(a, b snapshotindex.Record) int { return cmp.Compare(a.SessionID, b.SessionID) })
	lines := make([][]byte, len(sorted))
	for i, r := range sorted {
		line, err := toRecord(r).Line()
		if err != nil {
			return records.Manifest{}, err
		}
		lines[i] = line
	}
	return o.recordsWriter().Write(dir, checkpointID, lines, nil)
}

func toRecord(r snapshotindex.Record) records.Record {
	return records.Record{
		EpisodeID: records.EpisodeOf(r.Episode),
		SessionID: r.SessionID,
		State: records.State{
			Sandbox: records.SandboxState{
				ProviderName: r.Provider,
				Descriptor:   r.Sandbox,
				SnapshotID:   r.SnapshotID,
				Spec:         r.Spec,
				SnapshotAt:   records.UnixSeconds(r.SnapshotAt),
			},
			Workdir: r.Workdir,
			Data:    r.Data,
		},
	}
}

func fromRecord(r records.Record) snapshotindex.Record {
	s := r.State.Sandbox
	return snapshotindex.Record{
		SessionID:  r.SessionID,
		Episode:    r.EpisodeID.CaptureKey(),
		Provider:   s.ProviderName,
		Sandbox:    s.Descriptor,
		SnapshotID: s.SnapshotID,
		Spec:       s.Spec,
		Workdir:    r.State.Workdir,
		Data:       r.State.Data,
		SnapshotAt: records.TimeOf(s.SnapshotAt),
	}
}

// dirRecords reads this server's records under the request's dir: the
// checkpoint id its manifest names and its records, sorted by session.
func (o *Owner) dirRecords(req RestoreRequest) inDirRecords {
	var recs []snapshotindex.Record
	m, err := records.Read(o.recordsWriter().FS, req.CheckpointDir, o.participant(), func(line []byte) error {
		r, err := records.ParseRecord(line)
		if err != nil {
			return err
		}
		recs = append(recs, fromRecord(r))
		return nil
	})
	if errors.Is(err, records.ErrNoManifest) {
		return inDirRecords{NoManifest: true}
	}
	if err != nil {
		return inDirRecords{Err: err}
	}
	return inDirRecords{ID: m.CheckpointID, Records: slices.SortedFunc(slices.Values(recs), func(a, b snapshotindex.Record) int { return cmp.Compare(a.SessionID, b.SessionID) })}
}

// missingSnapshots is the error of a restore whose snapshots the provider
// does not have: the checkpoint cannot be restored here (422), and the
// operator needs their ids (a local snapshot stays on the machine that
// took it unless it was written to a shared snapshot_dir).
func missingSnapshots(err error, providerName string, ids []string) error {
	return fmt.Errorf("%w: %w: provider %s does not have snapshot(s) %s", err, ErrInvalidRecord, providerName, strings.Join(ids, ", "))
}
