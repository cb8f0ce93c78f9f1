package opensandboxtest

import (
	"context"
	"maps"
	"strings"
	"time"

	"github.com/sandboxowner/owner/provider"
)

func (s *Server) state(name string) string {
	if s.opts.LowerCaseStates {
		return strings.ToLower(name)
	}
	return name
}

func (s *Server) sandboxState(sb *sandbox, now time.Time) string {
	switch {
	case now.Before(sb.readyAt) && s.opts.PendingState != "":
		return s.opts.PendingState
	case now.Before(sb.readyAt):
		return s.state("Pending")
	case sb.failed:
		return s.state("Failed")
	case sb.exited != "":
		return s.state(sb.exited)
	case sb.paused || s.capturing(sb.id, now):
		// The runtime pauses a snapshot's source while it captures.
		return s.state("Paused")
	}
	return s.state("Running")
}

// capturing reports whether a snapshot of the sandbox is being captured (a
// queued one does not pause its source yet).
func (s *Server) capturing(id string, now time.Time) bool {
	for _, sn := range s.snapshots {
		if sn.sandboxID == id && !now.Before(sn.startAt) && now.Before(sn.readyAt) {
			return true
		}
	}
	return false
}

func (s *Server) snapshotState(sn *snapshot, now time.Time) string {
	switch {
	case now.Before(sn.readyAt):
		return s.state("Creating")
	case sn.deleting:
		return s.state("Deleting")
	case sn.failed:
		return s.state("Failed")
	}
	return s.state("Ready")
}

func (s *Server) running(sb *sandbox, now time.Time) bool {
	return strings.EqualFold(s.sandboxState(sb, now), "Running")
}

// reap deletes the sandboxes whose lease ran out, as the server's expiry
// timer does.
func (s *Server) reap() {
	now := s.clk.Now()
	var gone []provider.Handle
	s.mu.Lock()
	for id, sb := range s.sandboxes {
		if !sb.expiresAt.IsZero() && !now.Before(sb.expiresAt) {
			delete(s.sandboxes, id)
			s.stats.Expired++
			gone = append(gone, sb.backend)
		}
	}
	s.mu.Unlock()
	for _, h := range gone {
		_ = s.backend.Stop(context.Background(), h)
	}
}

// sync makes the records agree with a backend that can list: records of
// sandboxes and snapshots it no longer has are dropped, and what it has that
// the server never recorded is adopted (Running, Ready).
func (s *Server) sync(ctx context.Context) {
	l := s.backend.Capabilities().Lister
	if l == nil || !s.opts.SyncWithBackend {
		return
	}
	sbs, err1 := l.ListSandboxes(ctx)
	snaps, err2 := l.ListSnapshots(ctx)
	if err1 != nil || err2 != nil {
		return
	}
	now := s.clk.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	live := map[string]bool{}
	for _, info := range sbs {
		live[info.Handle.SandboxID] = true
		if _, ok := s.sandboxes[info.Handle.SandboxID]; ok {
			continue
		}
		s.seq++
		s.sandboxes[info.Handle.SandboxID] = &sandbox{
			id: info.Handle.SandboxID, seq: s.seq, createdAt: info.CreatedAt, readyAt: info.CreatedAt,
			expiresAt: info.ExpiresAt, metadata: maps.Clone(info.Metadata), entrypoint: []string{"tail", "-f", "/dev/null"},
			snapshotID: info.FromSnapshot, backend: info.Handle,
		}
		if info.FromSnapshot == "" {
			s.sandboxes[info.Handle.SandboxID].image = "adopted"
		}
	}
	for id := range s.sandboxes {
		if !live[id] {
			delete(s.sandboxes, id)
		}
	}
	have := map[string]bool{}
	for _, info := range snaps {
		have[info.ID] = true
		if _, ok := s.snapshots[info.ID]; ok {
			continue
		}
		s.seq++
		s.snapshots[info.ID] = &snapshot{id: info.ID, seq: s.seq, sandboxID: info.SandboxID, name: info.Name,
			createdAt: info.CreatedAt, readyAt: info.CreatedAt, backendID: info.ID}
	}
	for id, sn := range s.snapshots {
		if !have[sn.backendID] && !now.Before(sn.readyAt) {
			delete(s.snapshots, id)
		}
	}
}
