package local

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/sandboxowner/owner/provider"
)

// ErrHostsUnknown: a snapshot does not say which host directories its
// sandbox's mounts stood on (it was taken before snapshots recorded them,
// and its sandbox is gone), so what is in use cannot be told.
var ErrHostsUnknown = errors.New("local: a snapshot's mounted host directories are unknown")

// Users is where a provider keeps what can stand on host directories
// through its mounts (Mount.Host and Mount.Lower): its sandboxes and its
// snapshots. It is JSON, so that a program sharing host directories with
// other servers on this machine can record it for them (see HostsInUse).
type Users struct {
	Sandboxes string `json:"sandboxes"`
	Snapshots string `json:"snapshots"`
}

// Users is where p keeps its sandboxes and snapshots.
func (p *Provider) Users() Users {
	return Users{Sandboxes: p.sandboxesDir(), Snapshots: p.snapshotsDir()}
}

// HostsInUse are the host directories that the mounts of the sandboxes
// and snapshots under u stand on, read from their metadata files (no
// provider need run): every sandbox not yet removed, stopped or not, and
// every snapshot (a fork from a checkpoint mounts what its sandbox did).
// A start that has not written its metadata yet is not seen: whoever
// deletes host directories must keep what such a start named otherwise.
// A directory under u that is gone counts as empty. ErrHostsUnknown when
// a snapshot predates the record and its sandbox is gone.
func HostsInUse(u Users) (map[string]bool, error) {
	inUse := map[string]bool{}
	sandboxes, err := readMetas(u.Sandboxes)
	if err != nil {
		return nil, err
	}
	for id, b := range sandboxes {
		var m sandboxMeta
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("local: sandbox %s: %w", id, err)
		}
		hosts, err := mountHosts(m.Spec)
		if err != nil {
			return nil, fmt.Errorf("local: sandbox %s: %w", id, err)
		}
		for _, h := range hosts {
			inUse[h] = true
		}
	}
	snapshots, err := readMetas(u.Snapshots)
	if err != nil {
		return nil, err
	}
	for id, b := range snapshots {
		var m snapshotMeta
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("local: snapshot %s: %w", id, err)
		}
		if !m.HostsRecorded {
			if _, ok := sandboxes[m.SandboxID]; !ok {
				return nil, fmt.Errorf("%w: snapshot %s", ErrHostsUnknown, id)
			}
			continue // its sandbox's are counted
		}
		for _, h := range m.Hosts {
			inUse[h] = true
		}
	}
	return inUse, nil
}

// readMetas reads the meta.json of every directory under dir, by name;
// none when dir is gone. A directory without one (a start or snapshot
// not finished, or being removed) is skipped.
func readMetas(dir string) (map[string][]byte, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "meta.json"))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out[e.Name()] = b
	}
	return out, nil
}

// mountHosts are the host directories spec's mounts name (their Host and
// Lower).
func mountHosts(spec provider.Spec) ([]string, error) {
	ms, err := decodeMounts(spec)
	if err != nil {
		return nil, err
	}
	var hosts []string
	for _, m := range ms {
		hosts = append(append(hosts, m.Host), m.Lower...)
	}
	return hosts, nil
}
