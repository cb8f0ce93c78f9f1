package main

// Benchmarks of the local provider: start, exec, snapshot and fork
// latency, and snapshot/fork of a 100 MB, 5,000-file tree against `cp -a`
// of the same tree in the same run. Goals: snapshot ≤ 1.5× cp -a in copy
// mode; a fork in overlay mode under 50 ms whatever the tree's size.
//
//	go test ./bench -run '^$' -bench Local -benchtime 5x
//
// Overlay and container cases skip where they cannot run (overlay needs
// root; containers a kernel that allows unprivileged user namespaces).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local"
)

const (
	localTreeFiles = 5000
	localTreeBytes = 100 << 20
	localTreeDirs  = 50
)

// localTree writes the benchmark tree: localTreeFiles files of random
// content and sizes averaging localTreeBytes/localTreeFiles, in
// localTreeDirs directories, under dir/tree.
func localTree(b *testing.B, dir string) string {
	b.Helper()
	root := filepath.Join(dir, "tree")
	rng := rand.New(rand.NewChaCha8([32]byte{4}))
	avg := localTreeBytes / localTreeFiles
	buf := make([]byte, 2*avg)
	total := 0
	for i := range localTreeFiles {
		d := filepath.Join(root, fmt.Sprintf("d%02d", i%localTreeDirs))
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatal(err)
		}
		n := 1 + rng.IntN(2*avg-1)
		if i == localTreeFiles-1 {
			n = max(localTreeBytes-total, 1)
		}
		n = min(n, len(buf))
		for j := range buf[:n] {
			buf[j] = byte(rng.Uint32())
		}
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%04d.bin", i)), buf[:n], 0o644); err != nil {
			b.Fatal(err)
		}
		total += n
	}
	return root
}

func localProvider(b *testing.B, isolation, overlay string, templates map[string]string) *local.Provider {
	b.Helper()
	log := logrus.New()
	log.SetOutput(io.Discard)
	p, err := local.New(local.Options{Root: b.TempDir(), Isolation: isolation, Overlay: overlay, Templates: templates, Logger: log})
	switch {
	case errors.Is(err, local.ErrOverlayUnavailable):
		b.Skipf("SKIP: overlayfs cannot be mounted here: %v", err)
	case errors.Is(err, local.ErrIsolationUnavailable):
		b.Skipf("SKIP: the kernel refuses containers here: %v", err)
	case err != nil:
		b.Fatal(err)
	}
	b.Cleanup(func() {
		list, _ := p.ListSandboxes(context.Background())
		for _, s := range list {
			_ = p.Stop(context.Background(), s.Handle)
		}
		_ = p.Close() // what it made ahead, disks mounted, goes
	})
	return p
}

func localStart(b *testing.B, p *local.Provider, spec provider.Spec) provider.Handle {
	b.Helper()
	h, err := p.Start(context.Background(), spec)
	if err != nil {
		b.Fatal(err)
	}
	return h
}

// BenchmarkLocalStart: an empty sandbox, ready for commands.
func BenchmarkLocalStart(b *testing.B) {
	for _, c := range []struct{ iso, ov string }{{local.IsolationNone, local.OverlayOff}, {local.IsolationNone, local.OverlayOn}, {local.IsolationContainer, local.OverlayOff}, {local.IsolationContainer, local.OverlayOn}} {
		b.Run(c.iso+"-overlay-"+c.ov, func(b *testing.B) {
			p := localProvider(b, c.iso, c.ov, nil)
			ctx := context.Background()
			for b.Loop() {
				h, err := p.Start(ctx, provider.Spec{Files: map[string]string{"notes": "one\n"}})
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := p.Stop(ctx, h); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkLocalExec: one `true`, unisolated and in a container; median
// and 90th percentile, and the floor's median (see shellFloor).
func BenchmarkLocalExec(b *testing.B) {
	for _, iso := range []string{local.IsolationNone, local.IsolationContainer} {
		b.Run(iso, func(b *testing.B) {
			p := localProvider(b, iso, local.OverlayOff, nil)
			h := localStart(b, p, provider.Spec{})
			ctx := context.Background()
			measureExecs(b, func() {
				res, err := p.Exec(ctx, h, provider.ExecRequest{Command: "true"})
				if err != nil || res.ExitCode != 0 {
					b.Fatal(res, err)
				}
			})
		})
	}
}

// BenchmarkLocalSnapshotSmall: snapshot and fork of a sandbox holding one
// small file, in both modes: the fixed cost of each.
func BenchmarkLocalSnapshotSmall(b *testing.B) {
	for _, ov := range []string{local.OverlayOff, local.OverlayOn} {
		b.Run("overlay-"+ov, func(b *testing.B) {
			p := localProvider(b, local.IsolationNone, ov, nil)
			h := localStart(b, p, provider.Spec{Files: map[string]string{"notes": "one\n"}})
			ctx := context.Background()
			var snapTime, forkTime time.Duration
			n := 0
			for b.Loop() {
				t0 := time.Now()
				snap, err := p.Snapshot(ctx, h, "bench")
				if err != nil {
					b.Fatal(err)
				}
				snapTime += time.Since(t0)
				f := localFork(b, p, snap, &forkTime)
				n++
				b.StopTimer()
				localDrop(b, p, f, snap)
				b.StartTimer()
			}
			b.ReportMetric(ms(snapTime, n), "snapshot-ms")
			b.ReportMetric(ms(forkTime, n), "fork-ms")
		})
	}
}

// BenchmarkLocalSnapshotVsCpA: in copy mode, a snapshot of a sandbox holding
// the 100 MB, 5,000-file tree, against `cp -a` of the same tree, alternated
// in each iteration; then a fork of the snapshot (a copy too). Each
// iteration starts after a sync(2), so that neither side pays for the
// other's writeback: the figures are the copies' own cost.
func BenchmarkLocalSnapshotVsCpA(b *testing.B) {
	work := b.TempDir()
	tree := localTree(b, work)
	p := localProvider(b, local.IsolationNone, local.OverlayOff, map[string]string{"tree": tree})
	h := localStart(b, p, provider.Spec{Image: "tree"})
	src := filepath.Join(p.Root(), "sandboxes", h.SandboxID, "fs")
	ctx := context.Background()
	syscall.Sync()
	var cpTime, snapTime, forkTime time.Duration
	n := 0
	for b.Loop() {
		dst := filepath.Join(work, fmt.Sprintf("cp-%d", n))
		cp := func() {
			t0 := time.Now()
			if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
				b.Fatalf("cp -a: %v %s", err, out)
			}
			cpTime += time.Since(t0)
		}
		var snap string
		snapshot := func() {
			t0 := time.Now()
			var err error
			if snap, err = p.Snapshot(ctx, h, "bench"); err != nil {
				b.Fatal(err)
			}
			snapTime += time.Since(t0)
		}
		if n%2 == 0 {
			cp()
			snapshot()
		} else {
			snapshot()
			cp()
		}
		f := localFork(b, p, snap, &forkTime)
		n++
		b.StopTimer()
		localDrop(b, p, f, snap)
		if err := os.RemoveAll(dst); err != nil {
			b.Fatal(err)
		}
		syscall.Sync() // start each iteration with no writeback backlog
		b.StartTimer()
	}
	b.ReportMetric(ms(cpTime, n), "cp-a-ms")
	b.ReportMetric(ms(snapTime, n), "snapshot-ms")
	b.ReportMetric(float64(snapTime)/float64(cpTime), "snapshot/cp-a")
	b.ReportMetric(ms(forkTime, n), "fork-ms")
}

// BenchmarkLocalForkOverlay: in overlay mode, forks of a snapshot whose tree
// is the 100 MB one, either in the image the sandbox stands on ("in-image")
// or written by the sandbox itself, so that the snapshot's own layer holds
// all of it ("in-layer"). The snapshot is taken once; its time is reported.
func BenchmarkLocalForkOverlay(b *testing.B) {
	work := b.TempDir()
	tree := localTree(b, work)
	for _, where := range []string{"in-image", "in-layer"} {
		b.Run(where, func(b *testing.B) {
			p := localProvider(b, local.IsolationNone, local.OverlayOn, map[string]string{"tree": tree})
			ctx := context.Background()
			var h provider.Handle
			if where == "in-image" {
				h = localStart(b, p, provider.Spec{Image: "tree"})
			} else {
				h = localStart(b, p, provider.Spec{})
				res, err := p.Exec(ctx, h, provider.ExecRequest{Command: "cp -a " + tree + "/. .", Timeout: 10 * time.Minute})
				if err != nil || res.ExitCode != 0 {
					b.Fatal(res, err)
				}
			}
			t0 := time.Now()
			snap, err := p.Snapshot(ctx, h, "bench")
			if err != nil {
				b.Fatal(err)
			}
			snapTime := time.Since(t0)
			var forkTime time.Duration
			n := 0
			for b.Loop() {
				f := localFork(b, p, snap, &forkTime)
				n++
				b.StopTimer()
				if err := p.Stop(ctx, f); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(ms(snapTime, 1), "snapshot-ms")
			b.ReportMetric(ms(forkTime, n), "fork-ms")
		})
	}
}

// localFork forks snap, adding the call's time to total.
func localFork(b *testing.B, p *local.Provider, snap string, total *time.Duration) provider.Handle {
	b.Helper()
	t0 := time.Now()
	f, err := p.Fork(context.Background(), provider.Spec{}, snap)
	if err != nil {
		b.Fatal(err)
	}
	*total += time.Since(t0)
	return f
}

// localDrop stops the fork and deletes its snapshot.
func localDrop(b *testing.B, p *local.Provider, fork provider.Handle, snap string) {
	b.Helper()
	if err := p.Stop(context.Background(), fork); err != nil {
		b.Fatal(err)
	}
	if err := p.DeleteSnapshot(context.Background(), snap); err != nil {
		b.Fatal(err)
	}
}

func ms(d time.Duration, n int) float64 {
	return float64(d) / float64(time.Millisecond) / float64(max(n, 1))
}
