package app_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/app"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local"
	"github.com/sandboxowner/owner/sandbox"
)

// localOwner is an owner on a local provider at root (no isolation,
// copies), exporting into stateDir.
func localOwner(t *testing.T, root, stateDir string) (*local.Provider, *owner.Owner) {
	t.Helper()
	lg := logrus.New()
	lg.SetLevel(logrus.ErrorLevel)
	p, err := local.New(local.Options{Root: root, Templates: map[string]string{"notes": ""}, Isolation: "none", Overlay: "off", Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	// The test plays a crashed server and never closes it: its cgroups
	// (under the host's hierarchies) would outlive the test.
	t.Cleanup(func() { _ = p.Close() })
	o, err := owner.New(context.Background(), owner.Config{Name: "notes", Provider: p, Logger: lg,
		Checkpoint: owner.CheckpointConfig{Enabled: true, StateDir: stateDir}})
	if err != nil {
		t.Fatal(err)
	}
	return p, o
}

// TestSweepCommand leaves what a crashed server leaves on the local provider
// (a checkpointed session, one seeded after the checkpoint), then runs
// `server sweep` and `server sweep -reap` on the same configuration.
func TestSweepCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	root := filepath.Join(dir, "sandboxes")
	p, o := localOwner(t, root, dir)
	setup := func(context.Context, provider.Provider, sandbox.Sandbox) (json.RawMessage, error) { return nil, nil }
	if _, err := o.StartSessionSandbox(ctx, "kept", provider.Spec{Image: "notes"}, setup, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Commit(ctx, owner.CommitRequest{CheckpointID: "c1"}); err != nil {
		t.Fatal(err)
	}
	stray, err := o.StartSessionSandbox(ctx, "stray", provider.Spec{Image: "notes"}, setup, "")
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"-sandbox.provider", "local", "-sandbox.local.root", root, "-sandbox.local.isolation", "none",
		"-sandbox.local.overlay", "off", "-checkpoint.enabled", "-checkpoint.state_dir", dir,
		"-checkpoint.control_auth_token", "tok", "-log-level", "error"}

	// The running owner holds the index: the sweep refuses.
	var out, errOut strings.Builder
	if code := app.Run(ctx, append([]string{"sweep", "-reap"}, args...), &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "cannot read the index") {
		t.Fatalf("sweep with the index held: exit %d, stderr %q", code, errOut.String())
	}
	o.Abandon()
	// A directory the dead server had made ahead for a start.
	left := filepath.Join(root, "ready", "sb-left")
	if err := os.MkdirAll(filepath.Join(left, "disk"), 0o755); err != nil {
		t.Fatal(err)
	}

	out.Reset()
	errOut.Reset()
	if code := app.Run(ctx, append([]string{"sweep"}, args...), &out, &errOut); code != 0 {
		t.Fatalf("sweep: exit %d, stderr %q", code, errOut.String())
	}
	if want := "would stop sandbox " + stray.Handle.SandboxID; !strings.Contains(out.String(), want) || strings.Count(out.String(), "would ") != 1 {
		t.Fatalf("sweep output %q, want only %q", out.String(), want)
	}
	out.Reset()
	if code := app.Run(ctx, append([]string{"sweep", "-reap"}, args...), &out, &errOut); code != 0 {
		t.Fatalf("sweep -reap: exit %d, stderr %q", code, errOut.String())
	}
	if !strings.Contains(out.String(), "stopping sandbox "+stray.Handle.SandboxID) ||
		!strings.Contains(out.String(), "removed 1 sandbox directories made ahead that a stopped server left (sb-left)") {
		t.Fatalf("sweep -reap output %q", out.String())
	}
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Errorf("the directory made ahead after sweep -reap: %v, want it removed", err)
	}
	sbs, err := p.ListSandboxes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs) != 1 || sbs[0].Metadata[owner.LabelSession] != "kept" {
		t.Fatalf("left after the reap: %+v", sbs)
	}
}

// TestSweepRetainFrom: with -retain-from the sweep keeps exactly the
// snapshots the checkpoint records under the directory name, reads no
// index (none is given), and refuses a root that is not a directory.
func TestSweepRetainFrom(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir, ckRoot := t.TempDir(), t.TempDir()
	root := filepath.Join(dir, "sandboxes")
	p, o := localOwner(t, root, filepath.Join(dir, "state"))
	setup := func(context.Context, provider.Provider, sandbox.Sandbox) (json.RawMessage, error) { return nil, nil }
	if _, err := o.StartSessionSandbox(ctx, "s1", provider.Spec{Image: "notes"}, setup, ""); err != nil {
		t.Fatal(err)
	}
	snapshotOf := map[string]string{}
	for _, id := range []string{"c1", "c2"} {
		if _, err := o.Commit(ctx, owner.CommitRequest{CheckpointID: id, CheckpointDir: filepath.Join(ckRoot, id)}); err != nil {
			t.Fatal(err)
		}
		ck, err := o.Index().Checkpoint(id)
		if err != nil {
			t.Fatal(err)
		}
		snapshotOf[id] = ck.Records[0].SnapshotID
	}
	o.Abandon()
	// The controller pruned c1.
	if err := os.RemoveAll(filepath.Join(ckRoot, "c1")); err != nil {
		t.Fatal(err)
	}
	args := []string{"-sandbox.provider", "local", "-sandbox.local.root", root, "-sandbox.local.isolation", "none",
		"-sandbox.local.overlay", "off", "-log-level", "error"}
	var out, errOut strings.Builder
	notDir := filepath.Join(dir, "file")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := app.Run(ctx, append([]string{"sweep", "-reap", "-retain-from", notDir}, args...), &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "is not a directory") {
		t.Fatalf("sweep -retain-from a file: exit %d, stderr %q", code, errOut.String())
	}
	errOut.Reset()
	if code := app.Run(ctx, append([]string{"sweep", "-reap", "-retain-from=" + ckRoot}, args...), &out, &errOut); code != 0 {
		t.Fatalf("sweep -retain-from: exit %d, stderr %q", code, errOut.String())
	}
	if !strings.Contains(out.String(), "deleting snapshot "+snapshotOf["c1"]) || strings.Contains(out.String(), snapshotOf["c2"]) ||
		!strings.Contains(out.String(), "the 1 checkpoint records under "+ckRoot+" name") {
		t.Fatalf("sweep -retain-from output %q", out.String())
	}
	snaps, err := p.ListSnapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(snaps) != 1 || snaps[0].ID != snapshotOf["c2"] {
		t.Fatalf("snapshots left %+v, want only c2's %s", snaps, snapshotOf["c2"])
	}
}

// cgroupParentsOf are the cgroup directories a local provider on root made
// under this process's cgroups and left: one per hierarchy, named after the
// root (as provider/local's cgroupParent names them).
func cgroupParentsOf(t *testing.T, root string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Skipf("SKIP: no cgroups to read: %v", err)
	}
	sum := sha256.Sum256([]byte(root))
	name := "sandboxowner-" + hex.EncodeToString(sum[:6])
	var found []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		dirs := []string{filepath.Join("/sys/fs/cgroup", f[2]), filepath.Join("/sys/fs/cgroup/unified", f[2])}
		for _, c := range strings.Split(f[1], ",") {
			if c != "" && !strings.HasPrefix(c, "name=") {
				dirs = append(dirs, filepath.Join("/sys/fs/cgroup", c, f[2]))
			}
		}
		for _, d := range dirs {
			if p := filepath.Join(d, name); !slices.Contains(found, p) {
				if _, err := os.Stat(p); err == nil {
					found = append(found, p)
				}
			}
		}
	}
	return found
}

// `server sweep` closes the provider it built: the local provider's cgroup
// parents, which its New makes under the process's cgroup, are gone once
// the command returns (on a host that lets it make any).
func TestSweepCommandClosesItsProvider(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	root := filepath.Join(dir, "sandboxes")
	// A provider on the root shows where its parents go, and that Close
	// removes them.
	lg := logrus.New()
	lg.SetLevel(logrus.ErrorLevel)
	p, err := local.New(local.Options{Root: root, Templates: map[string]string{"notes": ""}, Isolation: "none", Overlay: "off", Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	made := cgroupParentsOf(t, root)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, d := range cgroupParentsOf(t, root) {
			_ = os.Remove(d)
		}
	})
	if len(made) == 0 {
		t.Skip("SKIP: the host lets a provider make no cgroup parent here")
	}
	if left := cgroupParentsOf(t, root); len(left) != 0 {
		t.Fatalf("a closed provider left %v", left)
	}
	args := []string{"sweep", "-sandbox.provider", "local", "-sandbox.local.root", root, "-sandbox.local.isolation", "none",
		"-sandbox.local.overlay", "off", "-checkpoint.enabled", "-checkpoint.state_dir", filepath.Join(dir, "state"),
		"-checkpoint.control_auth_token", "tok", "-log-level", "error"}
	var out, errOut strings.Builder
	if code := app.Run(context.Background(), args, &out, &errOut); code != 0 {
		t.Fatalf("sweep: exit %d, stderr %q", code, errOut.String())
	}
	if left := cgroupParentsOf(t, root); len(left) != 0 {
		t.Errorf("after the sweep, its provider's cgroup parents %v are left: it was not closed", left)
	}
}
