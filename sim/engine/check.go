package engine

import (
	"encoding/json"
	"errors"
	"maps"
	"path"
	"slices"

	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/snapshotindex"
)

const (
	notesFile = "notes.txt"
	tokenFile = ".seed_token"
)

// tokenOf reads the seed token out of session data.
func tokenOf(data json.RawMessage) string {
	var d struct {
		SeedToken string `json:"seed_token"`
	}
	_ = json.Unmarshal(data, &d)
	return d.SeedToken
}

// contentOf reads the notes and token out of a sandbox's or snapshot's files.
func contentOf(files map[string]string, workdir string) (notes []string, token string) {
	return parseNotes(files[path.Join(workdir, notesFile)]), files[path.Join(workdir, tokenFile)]
}

// indexState is what the index says exists.
type indexState struct {
	refs  map[string][]string // snapshot -> checkpoints naming it
	tomb  map[string]bool
	named map[string]bool // sandboxes checkpoint records name
}

// checkCheckpoints compares every checkpoint in idx with the model (whole
// checkpoints, restorable) and returns what the index accounts for.
func (r *run) checkCheckpoints(idx snapshotindex.Store, where string) (indexState, bool) {
	st := indexState{tomb: map[string]bool{}, named: map[string]bool{}}
	metas, err := idx.Checkpoints()
	if err != nil {
		r.violate(WholeCheckpoints, "%s: list checkpoints: %v", where, err)
		return st, false
	}
	inIndex := map[string]bool{}
	for _, meta := range metas {
		inIndex[meta.ID] = true
		want, ok := r.m.ckpts[meta.ID]
		if g := r.m.gone[meta.ID]; !ok && g != nil {
			// Its directory is gone; until it is dropped it is whole.
			want, ok = g.ck, true
		}
		if !ok {
			r.violate(WholeCheckpoints, "%s: the index holds checkpoint %s, which no successful commit made (or a release dropped)", where, meta.ID)
			continue
		}
		ck, err := idx.Checkpoint(meta.ID)
		if err != nil {
			r.violate(WholeCheckpoints, "%s: checkpoint %s does not load: %v", where, meta.ID, err)
			continue
		}
		var got []string
		for _, rec := range ck.Records {
			got = append(got, rec.SessionID)
			st.named[rec.Sandbox.SandboxID] = true
			w, ok := want.records[rec.SessionID]
			if !ok {
				continue
			}
			if tok := tokenOf(rec.Data); tok != w.token {
				r.violate(WholeCheckpoints, "%s: checkpoint %s records session %s with token %q, want %q", where, meta.ID, rec.SessionID, tok, w.token)
			}
			files, ok := r.fk.SnapshotFiles(rec.SnapshotID)
			if !ok {
				r.violate(Restorable, "%s: snapshot %s of session %s in checkpoint %s is gone", where, rec.SnapshotID, rec.SessionID, meta.ID)
				continue
			}
			notes, tok := contentOf(files, rec.Workdir)
			if !slices.Equal(notes, w.notes) || tok != w.token {
				r.violate(WholeCheckpoints, "%s: snapshot %s of session %s in checkpoint %s holds notes %q token %q, want notes %q token %q",
					where, rec.SnapshotID, rec.SessionID, meta.ID, notes, tok, w.notes, w.token)
			}
		}
		if wantIDs := slices.Sorted(maps.Keys(want.records)); !slices.Equal(got, wantIDs) {
			r.violate(WholeCheckpoints, "%s: checkpoint %s holds sessions %v, want %v", where, meta.ID, got, wantIDs)
		}
	}
	for _, id := range r.m.checkpointIDs() {
		if !inIndex[id] {
			r.violate(Restorable, "%s: committed checkpoint %s is gone from the index", where, id)
		}
	}
	st.refs, err = idx.ReferencedSnapshots()
	if err != nil {
		r.violate(WholeCheckpoints, "%s: referenced snapshots: %v", where, err)
		return st, false
	}
	for snap, cks := range st.refs {
		if _, ok := r.fk.SnapshotInfo(snap); !ok {
			r.violate(Restorable, "%s: snapshot %s, named by %v, does not exist", where, snap, cks)
		}
	}
	ts, err := idx.Tombstones()
	if err != nil {
		r.violate(WholeCheckpoints, "%s: tombstones: %v", where, err)
		return st, false
	}
	for _, t := range ts {
		st.tomb[t.SnapshotID] = true
	}
	return st, !r.broken
}

// held maps the sandboxes the owner's sessions hold to their sessions, and
// checks them against the model (live state, exact restore).
func (r *run) held() (map[string]string, bool) {
	out := map[string]string{}
	ids, err := r.o.Sessions()
	if err != nil {
		r.violate(Unexpected, "owner.Sessions: %v", err)
		return out, false
	}
	if want := r.m.live(); !slices.Equal(ids, want) {
		r.violate(LiveState, "the owner tracks sessions %v, the workload holds %v", ids, want)
		return out, false
	}
	for _, sid := range ids {
		s := r.m.sessions[sid]
		inv := LiveState
		if s.restored {
			inv = ExactRestore
		}
		sb, err := r.o.RequireSessionSandbox(r.life, sid)
		if err != nil {
			r.violate(inv, "live session %s has no sandbox: %v", sid, err)
			continue
		}
		out[sb.Handle.SandboxID] = sid
		r.lent[sb.Handle.SandboxID] = sid
		files, ok := r.fk.Files(sb.Handle.SandboxID)
		if !ok {
			r.violate(inv, "the sandbox %s of live session %s is gone from the backend", sb.Handle.SandboxID, sid)
			continue
		}
		notes, tok := contentOf(files, sb.Workdir)
		if !slices.Equal(notes, s.notes) || tok != s.token {
			r.violate(inv, "session %s's sandbox %s holds notes %q token %q, want notes %q token %q", sid, sb.Handle.SandboxID, notes, tok, s.notes, s.token)
		}
		if dt := tokenOf(sb.Data); dt != s.token {
			r.violate(inv, "session %s's data holds token %q, want %q", sid, dt, s.token)
		}
		if sb.Restored != s.restored {
			r.violate(inv, "session %s: restored = %v, want %v", sid, sb.Restored, s.restored)
		}
	}
	return out, !r.broken
}

// check runs every invariant over the real state: the owner's sessions,
// its open index and the fake backend.
func (r *run) check() {
	if r.broken || r.o == nil {
		return
	}
	st, ok := r.checkCheckpoints(r.o.Index(), "index")
	if !ok {
		return
	}
	held, ok := r.held()
	if !ok {
		return
	}
	pooled, templates := r.keyedHeld(held)
	if r.broken {
		return
	}
	for _, id := range r.fk.LiveSandboxIDs() {
		if _, ok := held[id]; !ok && !st.named[id] && !pooled[id] {
			info, _ := r.fk.Sandbox(id)
			r.violate(NoLeak, "sandbox %s (labels %v) runs, but no live session holds it and no checkpoint names it", id, info.Metadata)
		}
	}
	for _, id := range r.fk.SnapshotIDs() {
		if len(st.refs[id]) == 0 && !st.tomb[id] && !templates[id] {
			info, _ := r.fk.SnapshotInfo(id)
			r.violate(NoLeak, "snapshot %s (%s, of sandbox %s) exists, but no checkpoint names it and no tombstone covers it", id, info.Name, info.SandboxID)
		}
	}
}

// isNoSandbox reports a refusal for want of a session sandbox (409).
func isNoSandbox(err error) bool { return errors.Is(err, sandbox.ErrNone) }

func isLost(err error) bool { return errors.Is(err, sandbox.ErrLost) }
