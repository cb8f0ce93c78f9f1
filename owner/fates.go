package owner

import (
	"sync"

	"github.com/sandboxowner/owner/internal/fifo"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
)

// fateMemory remembers what became of a bounded number of sandboxes that
// are no longer held, so that an agent holding a stale sandbox id learns
// that it was superseded or ended instead of "unknown". What is held is the
// directory's to say: the fates record outcomes only.
type fateMemory struct {
	mu   sync.Mutex
	gone *fifo.Map[string, sandbox.Fate]
}

func newFateMemory(limit int) *fateMemory {
	return &fateMemory{gone: fifo.New[string, sandbox.Fate](limit)}
}

func (f *fateMemory) set(sandboxID string, fate sandbox.Fate) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gone.Put(sandboxID, fate)
}

func (f *fateMemory) get(sandboxID string) sandbox.Fate {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fate, ok := f.gone.Get(sandboxID); ok {
		return fate
	}
	return sandbox.FateUnknown
}

// liveSnapshots are the snapshots held sandboxes were forked from: a
// copy-on-write fork may still stand on them.
func (o *Owner) liveSnapshots() map[string]bool {
	out := map[string]bool{}
	for _, h := range o.dir.Holdings() {
		if from := h.FromSnapshot; from != "" {
			out[from] = true
		}
	}
	return out
}

func (o *Owner) onHeld(sessionID string, sb sandbox.Sandbox) {
	o.dir.Hold(sessionID, sb)
}

func (o *Owner) onLost(sessionID string, sb sandbox.Sandbox) {
	o.dir.MarkLost(sb.Handle.SandboxID)
}

// onEnded records the outcome before the directory lets go of the sandbox,
// so that SandboxFate never finds it in neither.
func (o *Owner) onEnded(sessionID string, stopped *provider.Handle, reason messages.StopReason) {
	if stopped != nil {
		o.fates.set(stopped.SandboxID, sandbox.FateEnded)
		o.dir.Drop(stopped.SandboxID)
	}
}

// SandboxFate tells what became of a sandbox the owner held: live (with the
// session holding it and its handle), ended, superseded by a restore's fork,
// or unknown.
func (o *Owner) SandboxFate(sandboxID string) (sessionID string, h provider.Handle, fate sandbox.Fate) {
	if held, ok := o.dir.Holder(sandboxID); ok {
		return held.SessionID, held.Handle, sandbox.FateLive
	}
	return "", provider.Handle{}, o.fates.get(sandboxID)
}
