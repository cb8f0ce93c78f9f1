package local

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/provider"
)

// HostsInUse reads what stands on host directories from the metadata a
// provider writes, through the Users its Capabilities give: a sandbox's
// mounts (host and lower layers) while it is not removed, a snapshot's
// after its sandbox went; a snapshot that predates the record, its
// sandbox gone, makes the answer unknown.
func TestHostsInUseReadsSandboxesAndSnapshots(t *testing.T) {
	ctx := context.Background()
	p := newProvider(t, mode{"none-copy", IsolationNone, OverlayOff}, Options{})
	var u Users
	if err := json.Unmarshal([]byte(p.Capabilities().HostMounts), &u); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	host, lower, other := filepath.Join(dir, "gen2"), filepath.Join(dir, "gen1"), filepath.Join(dir, "ro")
	for _, d := range []string{host, lower, other} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	spec := provider.Spec{ProviderOptions: map[string]any{MountsOption: []Mount{
		{Host: host, Path: "/caches/a", Mode: MountOverlay, Lower: []string{lower}},
		{Host: other, Path: "/caches/b", Mode: MountReadOnly},
	}}}
	h := start(t, p, spec)
	want := map[string]bool{host: true, lower: true, other: true}
	inUse := func() map[string]bool {
		t.Helper()
		got, err := HostsInUse(u)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if d := cmp.Diff(want, inUse()); d != "" {
		t.Errorf("with the sandbox (-want +got):\n%s", d)
	}
	snap, err := p.Snapshot(ctx, h, "ck")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(ctx, h); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, inUse()); d != "" {
		t.Errorf("with its snapshot only (-want +got):\n%s", d)
	}
	// A snapshot taken before snapshots recorded their mounts.
	path := p.snapshotMetaPath(snap)
	var m map[string]any
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "hosts")
	delete(m, "hosts_recorded")
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := HostsInUse(u); !errors.Is(err, ErrHostsUnknown) {
		t.Errorf("with an older snapshot whose sandbox is gone: %v, want ErrHostsUnknown", err)
	}
	if err := p.DeleteSnapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if got := inUse(); len(got) != 0 {
		t.Errorf("with nothing left: %v", got)
	}
}
