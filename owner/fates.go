package owner

import (
	"sync"

	"github.com/sandboxowner/owner/provider"
)

// Fate is what became of a sandbox the owner held.
type Fate string

// Fates.
const (
	FateLive       Fate = "live"
	FateEnded      Fate = "ended"
	FateSuperseded Fate = "superseded"
	FateUnknown    Fate = "unknown"
)

// fateMemory remembers the live sandboxes and a bounded number of gone
// ones, so that an agent holding a stale sandbox id learns that it was
// superseded or ended instead of "unknown".
type fateMemory struct {
	mu    sync.Mutex
	live  map[string]liveSandbox
	gone  map[string]Fate
	order []string // gone ids, oldest first
	limit int
}

type liveSandbox struct {
	sessionID    string
	handle       provider.Handle
	fromSnapshot string
}

func newFateMemory(limit int) *fateMemory {
	return &fateMemory{live: map[string]liveSandbox{}, gone: map[string]Fate{}, limit: limit}
}

func (f *fateMemory) hold(sessionID string, h provider.Handle, fromSnapshot string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.live[h.SandboxID] = liveSandbox{sessionID: sessionID, handle: h, fromSnapshot: fromSnapshot}
}

func (f *fateMemory) set(sandboxID string, fate Fate) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.live, sandboxID)
	if _, ok := f.gone[sandboxID]; !ok {
		f.order = append(f.order, sandboxID)
	}
	f.gone[sandboxID] = fate
	for len(f.order) > f.limit {
		delete(f.gone, f.order[0])
		f.order = f.order[1:]
	}
}

func (f *fateMemory) get(sandboxID string) (liveSandbox, Fate) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l, ok := f.live[sandboxID]; ok {
		return l, FateLive
	}
	if fate, ok := f.gone[sandboxID]; ok {
		return liveSandbox{}, fate
	}
	return liveSandbox{}, FateUnknown
}

// liveSnapshots are the snapshots live sandboxes were forked from: a
// copy-on-write fork may still stand on them.
func (f *fateMemory) liveSnapshots() map[string]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]bool{}
	for _, l := range f.live {
		if l.fromSnapshot != "" {
			out[l.fromSnapshot] = true
		}
	}
	return out
}

// liveCount is the number of live sandboxes.
func (f *fateMemory) liveCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.live)
}
