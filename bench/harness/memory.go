package harness

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
)

// MemorySample is what a memory child measured: resident set and live Go
// heap before and after starting Sessions sessions (or bare fake
// sandboxes), each read after a GC that returned freed memory to the OS.
type MemorySample struct {
	What       string `json:"what"`
	Sessions   int    `json:"sessions"`
	RSSBefore  int64  `json:"rss_before"`
	RSSAfter   int64  `json:"rss_after"`
	HeapBefore int64  `json:"heap_before"`
	HeapAfter  int64  `json:"heap_after"`
	Goroutines int    `json:"goroutines"`
}

// RSSPer is the growth of the resident set per session, in bytes.
func (s MemorySample) RSSPer() float64 { return float64(s.RSSAfter-s.RSSBefore) / float64(s.Sessions) }

// HeapPer is the growth of the live heap per session, in bytes.
func (s MemorySample) HeapPer() float64 {
	return float64(s.HeapAfter-s.HeapBefore) / float64(s.Sessions)
}

// MemoryResult is the memory section: the owner with its sessions, and the
// fake's sandboxes alone (what the in-memory provider, not the owner, holds
// per session), each from a fresh process.
type MemoryResult struct {
	Owner MemorySample
	Fake  MemorySample
}

// OwnerRSSPer is the owner's resident memory per idle session: the whole
// process's growth less the fake provider's share.
func (m *MemoryResult) OwnerRSSPer() float64 { return m.Owner.RSSPer() - m.Fake.RSSPer() }

// OwnerHeapPer is OwnerRSSPer for the live Go heap.
func (m *MemoryResult) OwnerHeapPer() float64 { return m.Owner.HeapPer() - m.Fake.HeapPer() }

func (h *harness) memory(ctx context.Context) (*MemoryResult, error) {
	n := strconv.Itoa(h.plan.memorySessions)
	var m MemoryResult
	if err := h.runChild(ctx, &m.Owner, "memory", "-what", "owner", "-sessions", n, "-dir", h.tmp); err != nil {
		return nil, err
	}
	if err := h.runChild(ctx, &m.Fake, "memory", "-what", "fake", "-sessions", n); err != nil {
		return nil, err
	}
	fmt.Fprintf(h.opts.Progress, "memory %d sessions: %.1f KiB RSS and %.1f KiB heap per session in all, %.1f KiB RSS and %.1f KiB heap of it the owner's\n",
		m.Owner.Sessions, m.Owner.RSSPer()/1024, m.Owner.HeapPer()/1024, m.OwnerRSSPer()/1024, m.OwnerHeapPer()/1024)
	return &m, nil
}

// settle collects garbage, returns it to the OS and reads RSS and heap.
func settle() (rss, heap int64, err error) {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss, err = VmRSS()
	return rss, int64(ms.HeapAlloc), err
}

func memoryChild(args []string, stdout io.Writer) error {
	var what, dir string
	var n int
	if err := childFlags("memory", args, func(fs *flag.FlagSet) {
		fs.StringVar(&what, "what", "owner", "owner or fake")
		fs.IntVar(&n, "sessions", 10000, "sessions to start")
		fs.StringVar(&dir, "dir", os.TempDir(), "where the owner's state dir goes")
	}); err != nil {
		return err
	}
	if n <= 0 {
		return fmt.Errorf("memory: -sessions must be positive")
	}
	ctx := context.Background()
	s := MemorySample{What: what, Sessions: n}
	fk := fake.New(fake.Options{Seed: 1})
	var err error
	switch what {
	case "owner":
		state, err := os.MkdirTemp(dir, "memory-")
		if err != nil {
			return fmt.Errorf("state dir: %w", err)
		}
		defer os.RemoveAll(state)
		o, err := owner.New(ctx, owner.Config{Name: "bench", Provider: fk,
			Checkpoint: owner.CheckpointConfig{Enabled: true, StateDir: state}})
		if err != nil {
			return fmt.Errorf("start owner: %w", err)
		}
		defer o.Close()
		// One session first, so that lazily built pools and tables are
		// in the baseline and not charged to the sessions.
		if err := SeedSessions(ctx, o, "warm", 1); err != nil {
			return err
		}
		if s.RSSBefore, s.HeapBefore, err = settle(); err != nil {
			return err
		}
		if err := SeedSessions(ctx, o, "s", n); err != nil {
			return err
		}
		if s.RSSAfter, s.HeapAfter, err = settle(); err != nil {
			return err
		}
	case "fake":
		start := func(i int, prefix string) error {
			h, err := fk.Start(ctx, provider.Spec{Image: "notes", Workdir: fake.DefaultWorkdir,
				Metadata: map[string]string{owner.LabelOwner: "bench", owner.LabelIncarnation: "0123456789abcdef", owner.LabelSession: fmt.Sprintf("%s-%06d", prefix, i)}})
			if err != nil {
				return fmt.Errorf("start: %w", err)
			}
			return fk.WriteFile(ctx, h, ".seed_token", []byte(fmt.Sprintf("tok-%s-%06d", prefix, i)))
		}
		if err := start(0, "warm"); err != nil {
			return err
		}
		if s.RSSBefore, s.HeapBefore, err = settle(); err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			if err := start(i, "s"); err != nil {
				return err
			}
		}
		if s.RSSAfter, s.HeapAfter, err = settle(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("memory: -what must be owner or fake, not %q", what)
	}
	s.Goroutines = runtime.NumGoroutine()
	runtime.KeepAlive(fk)
	return json.NewEncoder(stdout).Encode(s)
}
