package owner

import (
	"sync"

	"github.com/sandboxowner/owner/internal/fifo"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
)

// fateMemory remembers the live sandboxes and a bounded number of gone
// ones, so that an agent holding a stale sandbox id learns that it was
// superseded or ended instead of "unknown".
type fateMemory struct {
	mu   sync.Mutex
	live map[string]liveSandbox
	gone *fifo.Map[string, sandbox.Fate]
}

type liveSandbox struct {
	sessionID    string
	handle       provider.Handle
	fromSnapshot string
	// lost: found gone behind the owner's back; the session has not ended.
	lost bool
}

func newFateMemory(limit int) *fateMemory {
	return &fateMemory{live: map[string]liveSandbox{}, gone: fifo.New[string, sandbox.Fate](limit)}
}

func (f *fateMemory) hold(sessionID string, h provider.Handle, fromSnapshot string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.live[h.SandboxID] = liveSandbox{sessionID: sessionID, handle: h, fromSnapshot: fromSnapshot}
}

func (f *fateMemory) set(sandboxID string, fate sandbox.Fate) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.live, sandboxID)
	f.gone.Put(sandboxID, fate)
}

func (f *fateMemory) get(sandboxID string) (liveSandbox, sandbox.Fate) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l, ok := f.live[sandboxID]; ok {
		return l, sandbox.FateLive
	}
	if fate, ok := f.gone.Get(sandboxID); ok {
		return liveSandbox{}, fate
	}
	return liveSandbox{}, sandbox.FateUnknown
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

// liveCount is the number of live sandboxes, and of those among them that
// were lost.
func (f *fateMemory) liveCount() (live, lost int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, l := range f.live {
		if l.lost {
			lost++
		}
	}
	return len(f.live) - lost, lost
}

// markLost notes that a live sandbox was lost.
func (f *fateMemory) markLost(sandboxID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if l, ok := f.live[sandboxID]; ok {
		l.lost = true
		f.live[sandboxID] = l
	}
}

func (o *Owner) onHeld(sessionID string, sb sandbox.Sandbox) {
	o.fates.hold(sessionID, sb.Handle, sb.FromSnapshot)
}

func (o *Owner) onLost(sessionID string, sb sandbox.Sandbox) {
	o.fates.markLost(sb.Handle.SandboxID)
}

func (o *Owner) onEnded(sessionID string, stopped *provider.Handle, reason messages.StopReason) {
	if stopped != nil {
		o.fates.set(stopped.SandboxID, sandbox.FateEnded)
	}
}

// SandboxFate tells what became of a sandbox the owner held: live (with the
// session holding it and its handle), ended, superseded by a restore's fork,
// or unknown.
func (o *Owner) SandboxFate(sandboxID string) (sessionID string, h provider.Handle, fate sandbox.Fate) {
	l, fate := o.fates.get(sandboxID)
	return l.sessionID, l.handle, fate
}
