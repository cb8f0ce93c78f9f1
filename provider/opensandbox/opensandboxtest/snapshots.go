package opensandboxtest

import (
	"maps"
	"net/http"
	"time"
)

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	req, ok := s.readChecked(w, r, createSnapshotSchema, true)
	if !ok {
		return
	}
	sb, ok := s.lookup(w, r)
	if !ok {
		return
	}
	now := s.clk.Now()
	s.mu.Lock()
	running := s.running(sb, now)
	st := s.sandboxState(sb, now)
	s.mu.Unlock()
	if !running {
		writeError(w, http.StatusConflict, "SNAPSHOT::INVALID_SOURCE_STATE", "sandbox %s is %s, not Running", sb.id, st)
		return
	}
	if s.opts.NoSnapshots {
		writeError(w, http.StatusNotImplemented, "SNAPSHOT::NOT_IMPLEMENTED", "this runtime takes no snapshots")
		return
	}
	name, _ := req["name"].(string)
	backendID, err := s.backend.Snapshot(r.Context(), sb.backend, name)
	if err != nil {
		s.backendError(w, "SNAPSHOT::CREATE_FAILED", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	unfinished, at := 1, s.clk.Now()
	for _, o := range s.snapshots {
		if at.Before(o.readyAt) {
			unfinished++
		}
	}
	s.stats.PeakUnfinished = max(s.stats.PeakUnfinished, unfinished)
	// The capture takes the first free worker; until one frees, it queues.
	w0 := 0
	for i, t := range s.workers {
		if t.Before(s.workers[w0]) {
			w0 = i
		}
	}
	start := now
	if s.workers[w0].After(now) {
		start = s.workers[w0]
	}
	s.seq++
	sn := &snapshot{
		id:        backendID,
		seq:       s.seq,
		sandboxID: sb.id,
		name:      name,
		createdAt: now,
		startAt:   start,
		readyAt:   start.Add(s.opts.SnapshotLatency),
		backendID: backendID,
		metadata:  maps.Clone(sb.metadata),
		env:       maps.Clone(sb.env),
	}
	s.workers[w0] = sn.readyAt
	s.captures = append(s.captures, [2]time.Time{start, sn.readyAt})
	s.stats.PeakCaptures = max(s.stats.PeakCaptures, overlapping(s.captures, start))
	if s.failSnap > 0 {
		s.failSnap--
		sn.failed = true
	}
	s.snapshots[sn.id] = sn
	s.stats.SnapshotsCreated++
	w.Header().Set("Location", "/v1/snapshots/"+sn.id)
	writeJSON(w, http.StatusAccepted, s.snapshotJSON(sn, now))
}

// overlapping counts the captures running at t.
func overlapping(captures [][2]time.Time, t time.Time) int {
	n := 0
	for _, c := range captures {
		if !t.Before(c[0]) && t.Before(c[1]) {
			n++
		}
	}
	return n
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.sync(r.Context())
	s.mu.Lock()
	defer s.mu.Unlock()
	sn, ok := s.snapshots[id]
	if !ok {
		writeError(w, http.StatusNotFound, "SNAPSHOT::NOT_FOUND", "snapshot %s not found", id)
		return
	}
	writeJSON(w, http.StatusOK, s.snapshotJSON(sn, s.clk.Now()))
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.sync(r.Context())
	now := s.clk.Now()
	s.mu.Lock()
	sn, ok := s.snapshots[id]
	switch {
	case !ok:
		s.mu.Unlock()
		writeError(w, http.StatusNotFound, "SNAPSHOT::NOT_FOUND", "snapshot %s not found", id)
		return
	case now.Before(sn.readyAt):
		s.mu.Unlock()
		writeError(w, http.StatusConflict, "SNAPSHOT::INVALID_STATE", "snapshot %s is still Creating", id)
		return
	case s.forked(id):
		sn.deleting = true
		s.mu.Unlock()
		writeError(w, http.StatusConflict, "SNAPSHOT::DELETE_CONFLICT", "snapshot %s is in use by a sandbox forked from it", id)
		return
	}
	s.mu.Unlock()
	if err := s.backend.DeleteSnapshot(r.Context(), sn.backendID); err != nil {
		s.backendError(w, "SNAPSHOT::DELETE_FAILED", err)
		return
	}
	s.mu.Lock()
	delete(s.snapshots, id)
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// forked reports whether a listed sandbox was forked from the snapshot (the
// runtime cannot remove an image a container uses, even an exited one).
func (s *Server) forked(snapshotID string) bool {
	for _, sb := range s.sandboxes {
		if sb.snapshotID == snapshotID {
			return true
		}
	}
	return false
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	page, size, ok := s.paging(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	filter, source := states(q), q.Get("sandboxId")
	s.sync(r.Context())
	now := s.clk.Now()
	s.mu.Lock()
	var items []map[string]any
	for _, id := range newestFirst(idsBySeq(s.snapshots, func(sn *snapshot) int { return sn.seq })) {
		sn := s.snapshots[id]
		if matchState(filter, s.snapshotState(sn, now)) && (source == "" || sn.sandboxID == source) {
			items = append(items, s.snapshotJSON(sn, now))
		}
	}
	s.mu.Unlock()
	writePage(w, items, page, size)
}
