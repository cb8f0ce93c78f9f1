package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local"
	"github.com/sandboxowner/owner/sandbox"
)

// SandboxRow is one checkpoint operation of N real sandboxes on the local
// provider: each a checkout of the benchmark's Go module in which the agent
// changed some files.
type SandboxRow struct {
	Mode     string // local.OverlayOff ("copy") or local.OverlayOn ("overlay")
	Op       string // OpCommit or OpRestore
	Sessions int
	Wall     time.Duration
	// Bytes is what the operation wrote: the snapshots' layers (commit), the
	// forks' own trees (restore; an overlay fork's lower layers are shared,
	// not copied).
	Bytes int64
	// Pauses are how long each sandbox was paused by its snapshot, sorted
	// (commit only).
	Pauses []time.Duration
	// Floor is copying only the changed files of one sandbox, the least a
	// snapshot of it can pause it.
	Floor time.Duration
	Load  string
	Err   string
}

// PauseQuantile is the q-quantile of the pauses (0 without any).
func (r SandboxRow) PauseQuantile(q float64) time.Duration {
	if len(r.Pauses) == 0 {
		return 0
	}
	return quantile(r.Pauses, q)
}

// SandboxesResult is the sandboxes section: the tree, and the rows of each
// mode that could run (Skipped says why another could not).
type SandboxesResult struct {
	Files, Changed int
	TreeBytes      int64
	Parallelism    int
	Rows           []SandboxRow
	Skipped        map[string]string
}

// moduleShape is the benchmark's Go module: files spread over packages,
// about bytes in all; changed of them are rewritten by the agent.
type moduleShape struct {
	files, packages, changed int
	bytes                    int64
}

func shapeFor(mode string) (moduleShape, []int) {
	switch mode {
	case ModeTiny:
		return moduleShape{files: 30, packages: 3, changed: 2, bytes: 300 << 10}, []int{1, 2}
	case ModeQuick:
		return moduleShape{files: 3000, packages: 100, changed: 20, bytes: 50 << 20}, []int{1, 10}
	}
	return moduleShape{files: 3000, packages: 100, changed: 20, bytes: 50 << 20}, []int{1, 10, 100}
}

// writeModule writes the module under dir (go.mod and package files of
// Go-looking text) and returns its size and the relative paths of its Go
// files.
func writeModule(dir string, sh moduleShape) (int64, []string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/benchmod\n\ngo 1.22\n"), 0o644); err != nil {
		return 0, nil, err
	}
	rng := rand.New(rand.NewChaCha8([32]byte{17}))
	per := int(sh.bytes / int64(sh.files))
	var total int64
	var names []string
	for i := range sh.files {
		pkg := fmt.Sprintf("pkg%03d", i%sh.packages)
		rel := filepath.Join(pkg, fmt.Sprintf("file%04d.go", i))
		if err := os.MkdirAll(filepath.Join(dir, pkg), 0o755); err != nil {
			return 0, nil, err
		}
		b := goSource(rng, pkg, i, per/2+rng.IntN(per))
		if err := os.WriteFile(filepath.Join(dir, rel), b, 0o644); err != nil {
			return 0, nil, err
		}
		total += int64(len(b))
		names = append(names, rel)
	}
	return total, names, nil
}

// goSource is a Go file of about n bytes: a package clause and functions
// returning constants.
func goSource(rng *rand.Rand, pkg string, i, n int) []byte {
	b := fmt.Appendf(nil, "package %s\n\n", pkg)
	for f := 0; len(b) < n; f++ {
		b = fmt.Appendf(b, "// F%d_%d returns a value the generator picked.\nfunc F%d_%d() uint64 { return %d }\n\n", i, f, i, f, rng.Uint64())
	}
	return b
}

// treeBytes sums the sizes of the regular files under root, not crossing
// into other filesystems (an overlay fork's mount shows its lower layers,
// which it did not copy).
func treeBytes(root string) (int64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(root, &st); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, nil
		}
		return 0, err
	}
	dev := st.Dev
	var total int64
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
				return nil
			}
			return err
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if d.IsDir() {
			if s, ok := info.Sys().(*syscall.Stat_t); ok && s.Dev != dev {
				return filepath.SkipDir
			}
			return nil
		}
		if info.Mode().IsRegular() {
			total += info.Size()
		}
		return nil
	})
	return total, err
}

// copyFloor is the median time to copy files (relative to src) into a
// fresh directory: what a snapshot that copied only the changed files
// would pause a sandbox for.
func copyFloor(src string, files []string, tmp string) (time.Duration, error) {
	var ds []time.Duration
	for r := range 5 {
		dst := filepath.Join(tmp, fmt.Sprintf("floor-%d", r))
		t0 := time.Now()
		for _, f := range files {
			if err := copyFile(filepath.Join(src, f), filepath.Join(dst, f)); err != nil {
				return 0, err
			}
		}
		ds = append(ds, time.Since(t0))
		_ = os.RemoveAll(dst)
	}
	return median(ds), nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}

// sandboxes runs the section: for each fs mode, for each N, N sessions on
// the local provider each get a checkout of the module, the agent changes
// its files, and the owner commits them and restores them in a fresh owner.
func (h *harness) sandboxes(ctx context.Context) (*SandboxesResult, error) {
	sh, ns := shapeFor(h.opts.Mode)
	if len(h.opts.SandboxSessions) > 0 {
		ns = h.opts.SandboxSessions
	}
	modDir := filepath.Join(h.tmp, "module")
	size, names, err := writeModule(modDir, sh)
	if err != nil {
		return nil, fmt.Errorf("write the module: %w", err)
	}
	changed := make([]string, sh.changed)
	for i := range changed {
		changed[i] = names[(i*len(names))/sh.changed]
	}
	floor, err := copyFloor(modDir, changed, h.tmp)
	if err != nil {
		return nil, fmt.Errorf("copy floor: %w", err)
	}
	res := &SandboxesResult{Files: sh.files + 1, Changed: sh.changed, TreeBytes: size, Parallelism: 16, Skipped: map[string]string{}}
	fmt.Fprintf(h.opts.Progress, "sandboxes: a module of %d files, %.1f MiB; copying its %d changed files takes %s\n", res.Files, float64(size)/(1<<20), sh.changed, fmtDur(floor))
	for _, mode := range []string{local.OverlayOff, local.OverlayOn} {
		if len(h.opts.SandboxModes) > 0 && !slices.Contains(h.opts.SandboxModes, modeName(mode)) {
			continue
		}
		for _, n := range ns {
			if ctx.Err() != nil {
				return res, nil
			}
			rows, skip := h.sandboxCell(ctx, mode, n, modDir, changed, floor, res.Parallelism)
			if skip != "" {
				res.Skipped[modeName(mode)] = skip
				fmt.Fprintf(h.opts.Progress, "sandboxes %s: skipped: %s\n", modeName(mode), skip)
				break
			}
			for _, r := range rows {
				fmt.Fprintf(h.opts.Progress, "sandboxes %-7s %-7s N=%-3d wall %-9s copied %8.1f MiB pause p50 %-8s max %-8s (floor %s) load %s %s\n",
					modeName(r.Mode), r.Op, r.Sessions, fmtDur(r.Wall), float64(r.Bytes)/(1<<20), fmtDur(r.PauseQuantile(0.5)), fmtDur(r.PauseQuantile(1)), fmtDur(r.Floor), r.Load, r.Err)
			}
			res.Rows = append(res.Rows, rows...)
			h.update(func(r *Report) { r.Sandboxes = res })
		}
	}
	return res, nil
}

func modeName(overlay string) string {
	if overlay == local.OverlayOn {
		return "overlay"
	}
	return "copy"
}

// sandboxCell measures commit and restore of n sandboxes in one fs mode. A
// mode that cannot run here returns the reason instead.
func (h *harness) sandboxCell(ctx context.Context, mode string, n int, modDir string, changed []string, floor time.Duration, par int) ([]SandboxRow, string) {
	commit := SandboxRow{Mode: mode, Op: OpCommit, Sessions: n, Floor: floor}
	restore := SandboxRow{Mode: mode, Op: OpRestore, Sessions: n, Floor: floor}
	fail := func(err error) ([]SandboxRow, string) {
		commit.Err, restore.Err = oneLine(err.Error()), oneLine(err.Error())
		commit.Load, restore.Load = LoadAverage(), LoadAverage()
		return []SandboxRow{commit, restore}, ""
	}
	root, err := os.MkdirTemp(h.tmp, "local-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(root)
	lg := logrus.New()
	lg.SetOutput(io.Discard)
	var mu sync.Mutex
	var pauses []time.Duration
	p, err := local.New(local.Options{
		Root: filepath.Join(root, "provider"), Templates: map[string]string{"gomod": modDir},
		Isolation: local.IsolationNone, Overlay: mode, Logger: lg,
		OnPause: func(_ string, d time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			pauses = append(pauses, d)
		},
	})
	if errors.Is(err, local.ErrOverlayUnavailable) {
		return nil, err.Error()
	}
	if err != nil {
		return fail(err)
	}
	state := filepath.Join(root, "state")
	open := func() (*owner.Owner, error) {
		return owner.New(ctx, owner.Config{Name: "bench", Provider: p, Logger: lg,
			Checkpoint: owner.CheckpointConfig{Enabled: true, StateDir: state, Parallelism: par, RoundTimeout: time.Hour}})
	}
	o, err := open()
	if err != nil {
		return fail(err)
	}
	defer func() { _ = o.Close() }()
	// Seed the sessions and let the agent change its files, untimed.
	err = parallel(n, 4, func(i int) error {
		sid := fmt.Sprintf("sb-%03d", i)
		if _, err := o.StartSessionSandbox(ctx, sid, provider.Spec{Image: "gomod"}, nil, local.DefaultWorkdir); err != nil {
			return fmt.Errorf("seed %s: %w", sid, err)
		}
		return o.Do(ctx, sid, func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) error {
			for j, f := range changed {
				old, err := p.ReadFile(ctx, sb.Handle, f)
				if err != nil {
					return fmt.Errorf("read %s: %w", f, err)
				}
				if err := p.WriteFile(ctx, sb.Handle, f, fmt.Appendf(old, "\n// changed by the agent of %s (%d)\n", sid, j)); err != nil {
					return fmt.Errorf("write %s: %w", f, err)
				}
			}
			return nil
		})
	})
	if err != nil {
		return fail(err)
	}
	snapDir, boxDir := filepath.Join(root, "provider", "snapshots"), filepath.Join(root, "provider", "sandboxes")
	before, err := treeBytes(snapDir)
	if err != nil {
		return fail(err)
	}
	t0 := time.Now()
	cr, err := o.Commit(ctx, owner.CommitRequest{CheckpointID: "ck"})
	commit.Wall = time.Since(t0)
	if err == nil && len(cr.Sessions) != n {
		err = fmt.Errorf("commit exported %d sessions, want %d", len(cr.Sessions), n)
	}
	if err != nil {
		return fail(fmt.Errorf("commit: %w", err))
	}
	after, err := treeBytes(snapDir)
	if err != nil {
		return fail(err)
	}
	mu.Lock()
	commit.Bytes, commit.Pauses = after-before, slices.Sorted(slices.Values(pauses))
	mu.Unlock()
	commit.Load = LoadAverage()
	// A fresh owner restores them, as after a restart: the old one stops
	// its sandboxes as it closes.
	if err := o.Close(); err != nil {
		return fail(err)
	}
	if o, err = open(); err != nil {
		return fail(err)
	}
	before, err = treeBytes(boxDir)
	if err != nil {
		return fail(err)
	}
	t0 = time.Now()
	rr, err := o.Restore(ctx, owner.RestoreRequest{CheckpointID: "ck"})
	restore.Wall = time.Since(t0)
	if err == nil && len(rr.Sessions) != n {
		err = fmt.Errorf("restore installed %d sessions, want %d", len(rr.Sessions), n)
	}
	if err != nil {
		restore.Err, restore.Load = oneLine("restore: "+err.Error()), LoadAverage()
		return []SandboxRow{commit, restore}, ""
	}
	after, err = treeBytes(boxDir)
	if err == nil {
		err = checkRestored(ctx, o, rr.Sessions[0].SessionID, changed[0])
	}
	if err != nil {
		restore.Err = oneLine(err.Error())
	}
	restore.Bytes, restore.Load = after-before, LoadAverage()
	return []SandboxRow{commit, restore}, ""
}

// checkRestored reads a changed file back from a restored session: the
// agent's change must be there.
func checkRestored(ctx context.Context, o *owner.Owner, sid, file string) error {
	return o.Do(ctx, sid, func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) error {
		b, err := p.ReadFile(ctx, sb.Handle, file)
		if err != nil {
			return fmt.Errorf("read back %s of %s: %w", file, sid, err)
		}
		if !bytes.Contains(b, []byte("changed by the agent of "+sid)) {
			return fmt.Errorf("restored %s of %s lacks the agent's change", file, sid)
		}
		return nil
	})
}
