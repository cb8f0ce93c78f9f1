package http

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	nethttp "net/http"
	"sort"
	"strings"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/snapshotindex"
)

// participant is the resources server's side of the checkpoint protocol:
// control.Hooks on the owner, plus the data plane's bookkeeping of which
// session runs which episode.
type participant struct {
	s    *Server
	own  *owner.Owner
	log  *logrus.Entry
	gate *control.Gate
	m    *control.Machine

	mu sync.Mutex
	// bound: the episode each session was seeded for (under a rollout
	// prefix), or restored as.
	bound map[string]control.EpisodeID
	// pending: restored sessions no request has used yet.
	pending map[string]bool
	// retired: sessions a retire stopped, until forget of their rollout.
	retired map[string]control.EpisodeID
	// cutShort: sessions a retire could not stop; they block prepare until
	// a retry stops them.
	cutShort map[string]control.EpisodeID
}

func newParticipant(s *Server) *participant {
	p := &participant{
		s:        s,
		own:      s.own,
		log:      s.log.WithField("component", "participant"),
		bound:    map[string]control.EpisodeID{},
		pending:  map[string]bool{},
		retired:  map[string]control.EpisodeID{},
		cutShort: map[string]control.EpisodeID{},
	}
	p.gate = control.NewGate(func() {
		if p.m != nil {
			p.m.Notify()
		}
	})
	return p
}

// --- data plane ---

func (p *participant) boundEpisode(sid string) (control.EpisodeID, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.bound[sid]; ok {
		return e, true
	}
	e, ok := p.retired[sid]
	return e, ok
}

func (p *participant) bind(sid string, e control.EpisodeID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bound[sid] = e
	delete(p.retired, sid)
}

func (p *participant) unbind(sid string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.bound, sid)
	delete(p.pending, sid)
}

// admit runs a data request through admission: it waits while a checkpoint
// is open (seeds always, other routes unless replayable or in restart_only),
// counts it in flight, and refuses a retired attempt with stale_attempt
// (/close_session never). The returned func ends the request's count.
func (p *participant) admit(ctx context.Context, kind routeKind, sess *Session) (func(), error) {
	replay := kind == kindVerify && p.s.verifyMode == "replay"
	var leave func()
	if !replay {
		wait := kind == kindSeed || p.s.mode != owner.ModeRestartOnly
		label := "session:" + sess.ID
		if sess.HasEpisode {
			label = sess.Episode.CaptureKey()
		}
		var err error
		// Counted before the fence is checked, so a retire that fences
		// after this check still waits for the request to end.
		if leave, err = p.gate.Enter(ctx, control.Entry{Session: sess.ID, Label: label, Wait: wait}); err != nil {
			return nil, err
		}
	}
	if kind != kindClose && sess.HasEpisode && p.m.Fenced(sess.Episode) {
		if leave != nil {
			leave()
		}
		return nil, control.ErrStaleAttempt.With("episode %s was retired", sess.Episode.CaptureKey())
	}
	// Any admitted request claims a restored session.
	p.mu.Lock()
	delete(p.pending, sess.ID)
	p.mu.Unlock()
	return leave, nil
}

// --- control.Hooks ---

func (p *participant) CloseAdmission() error { p.gate.Close(); return nil }

func (p *participant) OpenAdmission() { p.gate.Open() }

func (p *participant) Readiness() control.Report {
	var blockers []string
	inflight := 0
	if p.s.mode != owner.ModeRestartOnly {
		// A restart_only server's requests never hold up a checkpoint.
		blockers = p.gate.Busy()
		inflight = p.gate.Inflight()
	}
	p.mu.Lock()
	for _, e := range p.cutShort {
		blockers = append(blockers, e.CaptureKey())
	}
	sessions := len(p.bound)
	var restarts []string
	if p.s.mode == owner.ModeRestartOnly {
		for _, e := range p.bound {
			restarts = append(restarts, e.CaptureKey())
		}
	}
	p.mu.Unlock()
	sort.Strings(blockers)
	sort.Strings(restarts)
	return control.Report{
		Ready:    len(blockers) == 0,
		Blockers: blockers,
		Counts:   map[string]int{"inflight": inflight, "sessions": sessions},
		Restarts: restarts,
	}
}

func (p *participant) Describe() control.Description {
	p.mu.Lock()
	defer p.mu.Unlock()
	return control.Description{Mode: string(p.s.mode), Verify: p.s.verifyMode, RetiredSessions: len(p.retired)}
}

// emptySHA256 is the records digest of a checkpoint without records.
var emptySHA256 = func() string { s := sha256.Sum256(nil); return hex.EncodeToString(s[:]) }()

func (p *participant) Commit(ctx context.Context, req control.CommitRequest) (control.CommitResult, error) {
	var inScope map[string]bool
	if req.EpisodeIDs != nil {
		inScope = map[string]bool{}
		for _, k := range control.CaptureKeys(req.EpisodeIDs) {
			inScope[k] = true
		}
	}
	// Only sessions bound to an episode are tracked by checkpoints; a
	// restored session the scope leaves out is deleted after the commit.
	scope := []string{}
	episodes := map[string]string{}
	var unclaimed []string
	p.mu.Lock()
	for sid, e := range p.bound {
		k := e.CaptureKey()
		if inScope == nil || inScope[k] {
			scope = append(scope, sid)
			episodes[sid] = k
		} else if p.pending[sid] {
			unclaimed = append(unclaimed, sid)
		}
	}
	p.mu.Unlock()
	sort.Strings(scope)
	res, err := p.own.Commit(ctx, owner.CommitRequest{
		CheckpointID:  req.CheckpointID,
		CheckpointDir: req.CheckpointDir,
		Scope:         scope,
		Stop:          req.Stop,
		Episodes:      episodes,
		Deadline:      req.Deadline(),
	})
	if err != nil {
		if errors.Is(err, snapshotindex.ErrConflict) {
			return control.CommitResult{}, control.ErrCheckpointConflict.Wrap(err)
		}
		return control.CommitResult{}, Wrap(nethttp.StatusInternalServerError, CodeCommitFailed, err)
	}
	out := control.CommitResult{Manifest: control.Manifest{CheckpointID: req.CheckpointID, RecordsSHA256: emptySHA256}, EpisodeIDs: []string{}}
	if res.Meta.ID != "" {
		out.Manifest.RecordCount, out.Manifest.RecordsSHA256 = res.Meta.RecordCount, res.Meta.RecordsSHA256
	}
	for _, sid := range res.Sessions {
		if k, ok := episodes[sid]; ok {
			out.EpisodeIDs = append(out.EpisodeIDs, k)
		} else if e, ok := p.boundEpisode(sid); ok {
			// A retried commit reports the records as first written.
			out.EpisodeIDs = append(out.EpisodeIDs, e.CaptureKey())
		}
	}
	sort.Strings(out.EpisodeIDs)
	for _, sid := range res.Parked {
		out.Parked = append(out.Parked, episodes[sid])
		p.unbind(sid)
	}
	sort.Strings(out.Parked)
	for _, sid := range unclaimed {
		// delete_restored, not a retire: no attempt is fenced, and the
		// snapshot stays for the checkpoint that names it.
		if err := p.own.EndSessionSandbox(ctx, sid); err != nil {
			p.log.WithError(err).WithField("session", sid).Warn("could not stop a restored session the commit left out")
			continue
		}
		p.unbind(sid)
	}
	return out, nil
}

func (p *participant) Restore(ctx context.Context, req control.RestoreRequest) (control.RestoreResult, error) {
	live, err := p.own.Sessions()
	if err != nil {
		return control.RestoreResult{}, err
	}
	p.mu.Lock()
	bound := len(p.bound)
	p.mu.Unlock()
	if len(live) > 0 || bound > 0 || p.gate.Inflight() > 0 {
		return control.RestoreResult{}, control.ErrInvalidPhase.With("restore needs a process with no live sessions (%d sessions, %d requests in flight)", max(len(live), bound), p.gate.Inflight())
	}
	if p.s.mode == owner.ModeRestartOnly {
		// Nothing of this server is ever in a checkpoint: its episodes
		// restart from their inputs.
		return control.RestoreResult{SourceCheckpointID: req.SourceCheckpointID, Restored: []string{}}, nil
	}
	idx := p.own.Index()
	src := req.SourceCheckpointID
	if src == "" {
		meta, ok, err := idx.FindByDir(req.CheckpointDir)
		if err != nil {
			return control.RestoreResult{}, control.ErrInvalidCheckpointState.With("find the checkpoint of %s: %v", req.CheckpointDir, err)
		}
		if !ok {
			return control.RestoreResult{}, control.ErrInvalidCheckpointState.With("no checkpoint was committed with checkpoint_dir %s", req.CheckpointDir)
		}
		src = meta.ID
	}
	ck, err := idx.Checkpoint(src)
	if err != nil {
		return control.RestoreResult{}, control.ErrInvalidCheckpointState.With("checkpoint %s: %v", src, err)
	}
	if req.CheckpointDir != "" && ck.Meta.CheckpointDir != "" && ck.Meta.CheckpointDir != req.CheckpointDir {
		return control.RestoreResult{}, control.ErrInvalidCheckpointState.With("checkpoint %s was committed with checkpoint_dir %s, not %s", src, ck.Meta.CheckpointDir, req.CheckpointDir)
	}
	want := map[string]bool{}
	for _, k := range control.CaptureKeys(req.EpisodeIDs) {
		want[k] = true
	}
	var sessions []string
	next := map[string]control.EpisodeID{}
	for _, r := range ck.Records {
		if !want[r.Episode] {
			continue
		}
		e, err := control.ParseCaptureKey(r.Episode)
		if err != nil {
			return control.RestoreResult{}, control.ErrInvalidCheckpointState.With("record of session %s names episode %q: %v", r.SessionID, r.Episode, err)
		}
		sessions = append(sessions, r.SessionID)
		next[r.SessionID] = e.Next()
	}
	out := control.RestoreResult{SourceCheckpointID: src, Restored: []string{}}
	if len(sessions) == 0 {
		return out, nil
	}
	if _, err := p.own.Restore(ctx, owner.RestoreRequest{CheckpointID: src, Sessions: sessions}); err != nil {
		if errors.Is(err, owner.ErrInvalidRecord) || errors.Is(err, owner.ErrUnknownCheckpoint) {
			return control.RestoreResult{}, control.ErrInvalidCheckpointState.Wrap(err)
		}
		return control.RestoreResult{}, Wrap(nethttp.StatusInternalServerError, CodeRestoreFailed, err)
	}
	p.mu.Lock()
	for sid, e := range next {
		p.bound[sid] = e
		p.pending[sid] = true
		out.Restored = append(out.Restored, e.CaptureKey())
	}
	p.mu.Unlock()
	sort.Strings(out.Restored)
	return out, nil
}

func (p *participant) Retire(ctx context.Context, eps []control.EpisodeID) error {
	p.mu.Lock()
	var sessions []string
	for sid, e := range p.bound {
		if p.m.Fenced(e) {
			sessions = append(sessions, sid)
		}
	}
	for sid, e := range p.cutShort {
		if _, ok := p.bound[sid]; !ok && p.m.Fenced(e) {
			sessions = append(sessions, sid)
		}
	}
	p.mu.Unlock()
	sort.Strings(sessions)
	if len(sessions) == 0 {
		return nil
	}
	fail := func(err error, failed map[string]string) error {
		p.mu.Lock()
		for _, sid := range sessions {
			if e, ok := p.bound[sid]; ok && (failed == nil || failed[sid] != "") {
				p.cutShort[sid] = e
			}
		}
		p.mu.Unlock()
		return err
	}
	if err := p.gate.WaitIdle(ctx, sessions); err != nil {
		return fail(err, nil)
	}
	res, err := p.own.Retire(ctx, sessions)
	p.mu.Lock()
	for _, sid := range sessions {
		if _, failed := res.Failed[sid]; failed {
			continue
		}
		if e, ok := p.bound[sid]; ok {
			p.retired[sid] = e
		} else if e, ok := p.cutShort[sid]; ok {
			p.retired[sid] = e
		}
		delete(p.bound, sid)
		delete(p.pending, sid)
		delete(p.cutShort, sid)
	}
	p.mu.Unlock()
	if err != nil {
		return fail(Wrap(nethttp.StatusInternalServerError, CodeRetireFailed, err), res.Failed)
	}
	p.log.WithFields(logrus.Fields{"episodes": control.CaptureKeys(eps), "sessions": len(sessions)}).Info("retired attempts")
	return nil
}

func (p *participant) Forget(rolloutIDs []string) {
	drop := map[string]bool{}
	for _, id := range rolloutIDs {
		drop[id] = true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for sid, e := range p.retired {
		if drop[e.RolloutID] {
			delete(p.retired, sid)
		}
	}
}

// releaseRequest is the body of our release route.
type releaseRequest struct {
	KeptCheckpointIDs *[]string `json:"kept_checkpoint_ids"`
}

// ReleaseReply answers release.
type ReleaseReply struct {
	Kept     []string          `json:"kept_checkpoint_ids"`
	Dropped  []string          `json:"dropped"`
	Deleted  []string          `json:"deleted"`
	Deferred []string          `json:"deferred"`
	Failed   map[string]string `json:"failed,omitempty"`
}

func (p *participant) release(ctx context.Context, req releaseRequest) (any, error) {
	if req.KeptCheckpointIDs == nil {
		// Required, so that an empty body cannot drop every checkpoint.
		return nil, Invalid("kept_checkpoint_ids is required (an empty list keeps none)")
	}
	kept := append([]string{}, *req.KeptCheckpointIDs...)
	for i, id := range kept {
		// An id no checkpoint can have keeps nothing: a typo must not drop
		// every checkpoint.
		if err := control.ValidateCheckpointID(fmt.Sprintf("kept_checkpoint_ids[%d]", i), id); err != nil {
			return nil, err
		}
	}
	res, err := p.own.Release(ctx, kept)
	nonNil := func(s []string) []string {
		if s == nil {
			return []string{}
		}
		return s
	}
	rep := ReleaseReply{Kept: kept, Dropped: nonNil(res.Dropped), Deleted: nonNil(res.Deleted), Deferred: nonNil(res.Deferred), Failed: res.Failed}
	if err != nil {
		e := Wrap(nethttp.StatusInternalServerError, CodeReleaseFailed, err)
		e.Detail += fmt.Sprintf(" (dropped %s; a retry deletes the rest)", strings.Join(rep.Dropped, ", "))
		return nil, e
	}
	return rep, nil
}
