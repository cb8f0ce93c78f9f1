// Package participant is the resources server's side of the checkpoint
// protocol, apart from any transport: which session runs which episode,
// admission of data requests through the gate, retire fencing, restore by
// checkpoint_dir, sessions a retire cut short, and release. It implements
// the control plane's hooks over a narrow Owner and builds the control
// Machine itself, so nothing is wired after construction. Package http only
// decodes requests, calls it, and encodes the answers.
package participant

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/problem"
	"github.com/sandboxowner/owner/records"
	"github.com/sandboxowner/owner/resources"
	"github.com/sandboxowner/owner/sched"
	"github.com/sandboxowner/owner/snapshotindex"
)

// Owner is what the participant needs of the owner.
type Owner interface {
	Commit(ctx context.Context, req owner.CommitRequest) (owner.CommitResult, error)
	StopCommit(id string)
	Restore(ctx context.Context, req owner.RestoreRequest) (owner.RestoreResult, error)
	Retire(ctx context.Context, sessionIDs []string) (owner.RetireResult, error)
	Release(ctx context.Context, kept []string) (owner.ReleaseResult, error)
	CheckRetention(ctx context.Context) (owner.RetentionResult, error)
	RetentionStatus() owner.RetentionStatus
	EndSessionSandbox(ctx context.Context, sessionID string) error
	Sessions() ([]string, error)
}

var _ Owner = (*owner.Owner)(nil)

// Envelope codes of the participant's failures.
const (
	CodeCommitFailed  = "commit_failed"
	CodeRestoreFailed = "restore_failed"
	CodeRetireFailed  = "retire_failed"
	CodeReleaseFailed = "release_failed"
	// CodeRetentionFailed: a check of the checkpoint directories could
	// not drop or delete what it decided to.
	CodeRetentionFailed = "retention_failed"
)

// Config configures a Participant.
type Config struct {
	Owner Owner
	// Mode is the checkpoint mode in effect: exported, or restart_only
	// (nothing of this server is ever in a checkpoint).
	Mode owner.Mode
	// VerifyReplayable: verify is neither counted in flight nor held.
	VerifyReplayable bool
	// Instance is the server's name in status.
	Instance string
	// Clock, LeaseGrace, PollEvery and MaxDeadline configure the control
	// machine (see control.Config).
	Clock clock.Clock
	// Runtime runs the control plane's hook runs and waits (nil:
	// goroutines).
	Runtime     sched.Runtime
	LeaseGrace  time.Duration
	PollEvery   time.Duration
	MaxDeadline time.Duration
	Logger      logrus.FieldLogger
}

// Kind classifies a data request for admission.
type Kind int

// Data request kinds.
const (
	Tool Kind = iota
	Seed
	Verify
	Close
)

// Participant is safe for concurrent use.
type Participant struct {
	own    Owner
	mode   owner.Mode
	replay bool
	log    logrus.FieldLogger
	gate   *control.Gate
	m      *control.Machine

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

// New returns a participant with an idle control machine.
func New(cfg Config) *Participant {
	if cfg.Logger == nil {
		cfg.Logger = logs.Discard()
	}
	p := &Participant{
		own:      cfg.Owner,
		mode:     cfg.Mode,
		replay:   cfg.VerifyReplayable,
		log:      cfg.Logger.WithField("component", "participant"),
		bound:    map[string]control.EpisodeID{},
		pending:  map[string]bool{},
		retired:  map[string]control.EpisodeID{},
		cutShort: map[string]control.EpisodeID{},
	}
	p.m = control.New(control.Config{
		Kind:        "resources",
		Instance:    cfg.Instance,
		Hooks:       hooks{p},
		Clock:       cfg.Clock,
		Runtime:     cfg.Runtime,
		LeaseGrace:  cfg.LeaseGrace,
		PollEvery:   cfg.PollEvery,
		MaxDeadline: cfg.MaxDeadline,
		Logger:      cfg.Logger,
	})
	p.gate = control.NewGateOn(p.m.Notify, cfg.Runtime)
	return p
}

// Machine is the control plane's phase machine.
func (p *Participant) Machine() *control.Machine { return p.m }

// Gate is the admission gate.
func (p *Participant) Gate() *control.Gate { return p.gate }

// VerifyMode is "replay" or "wait", as seed replies announce it.
func (p *Participant) VerifyMode() string {
	if p.replay {
		return "replay"
	}
	return "wait"
}

// --- data plane ---

// BoundEpisode is the episode a session was seeded for or restored as (or
// retired from).
func (p *Participant) BoundEpisode(sid string) (control.EpisodeID, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.bound[sid]; ok {
		return e, true
	}
	e, ok := p.retired[sid]
	return e, ok
}

// Bind records the episode a seed bound the session to.
func (p *Participant) Bind(sid string, e control.EpisodeID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bound[sid] = e
	delete(p.retired, sid)
}

// Unbind forgets a session that ended (verified, closed).
func (p *Participant) Unbind(sid string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.bound, sid)
	delete(p.pending, sid)
}

// Admit runs a data request through admission: it waits while a checkpoint
// is open (seeds always, other routes unless replayable or in restart_only),
// counts it in flight, and refuses a retired attempt with stale_attempt
// (Close never). The returned func, if any, ends the request's count.
func (p *Participant) Admit(ctx context.Context, kind Kind, sess *resources.Session) (func(), error) {
	replay := kind == Verify && p.replay
	var leave func()
	if !replay {
		wait := kind == Seed || p.mode != owner.ModeRestartOnly
		// A blocker is named by its capture key, which a controller can
		// retire; a session bound to no episode is never exported, so its
		// requests hold up no checkpoint.
		label := ""
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
	if kind != Close {
		// Refused: a request of a retired attempt, and any request of a
		// session that belongs to one (a seed under a later attempt's
		// prefix included), until forget.
		p.mu.Lock()
		retired, ok := p.retired[sess.ID]
		p.mu.Unlock()
		if !ok && sess.HasEpisode && p.m.Fenced(sess.Episode) {
			retired, ok = sess.Episode, true
		}
		if ok {
			if leave != nil {
				leave()
			}
			return nil, control.ErrStaleAttempt.With("episode %s was retired", retired.CaptureKey())
		}
	}
	// Any admitted request claims a restored session.
	p.mu.Lock()
	delete(p.pending, sess.ID)
	p.mu.Unlock()
	return leave, nil
}

// AdmitSandboxCall passes a call an agent makes on its session's sandbox
// (an exec, a file write) through the gate as a tool call is: it waits
// while a checkpoint is open (unless restart_only) and is counted in
// flight, named by the session's episode, until leave is called.
func (p *Participant) AdmitSandboxCall(ctx context.Context, sessionID string) (leave func(), err error) {
	label := ""
	if e, ok := p.BoundEpisode(sessionID); ok {
		label = e.CaptureKey()
	}
	return p.gate.Enter(ctx, control.Entry{Session: sessionID, Label: label, Wait: p.mode != owner.ModeRestartOnly})
}

// --- control.Hooks ---

// hooks are the control machine's hooks; kept off Participant's own
// methods so that only the machine calls them.
type hooks struct{ *Participant }

func (h hooks) CloseAdmission() error { h.gate.Close(); return nil }

func (h hooks) OpenAdmission() { h.gate.Open() }

func (h hooks) Readiness() control.Report {
	p := h.Participant
	var blockers []string
	inflight := 0
	if p.mode != owner.ModeRestartOnly {
		// A restart_only server's requests never hold up a checkpoint.
		blockers = p.gate.Busy()
		inflight = p.gate.Blocking()
	}
	p.mu.Lock()
	for _, e := range p.cutShort {
		blockers = append(blockers, e.CaptureKey())
	}
	sessions := len(p.bound)
	var restarts []string
	if p.mode == owner.ModeRestartOnly {
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

func (h hooks) Describe() control.Description {
	p := h.Participant
	p.mu.Lock()
	defer p.mu.Unlock()
	return control.Description{Mode: string(p.mode), Verify: p.VerifyMode(), RetiredSessions: len(p.retired)}
}

// emptySHA256 is the records digest of a checkpoint without records.
var emptySHA256 = func() string { s := sha256.Sum256(nil); return hex.EncodeToString(s[:]) }()

// manifestOf is the manifest a commit reply carries: the one written under
// the checkpoint_dir, else (an owner that wrote none) the index's count
// and digest.
func manifestOf(checkpointID string, res owner.CommitResult) control.Manifest {
	if m := res.Manifest; m.RecordsFile != "" {
		return control.Manifest{SchemaVersion: m.SchemaVersion, Kind: m.Kind, Instance: m.Instance, CheckpointID: m.CheckpointID,
			RecordsFile: m.RecordsFile, RecordsSHA256: m.RecordsSHA256, RecordCount: m.RecordCount}
	}
	out := control.Manifest{CheckpointID: checkpointID, RecordsSHA256: emptySHA256}
	if res.Meta.ID != "" {
		out.RecordCount, out.RecordsSHA256 = res.Meta.RecordCount, res.Meta.RecordsSHA256
	}
	return out
}

func (h hooks) Commit(ctx context.Context, req control.CommitRequest) (control.CommitResult, error) {
	p := h.Participant
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
	sort.Strings(unclaimed)
	res, err := p.own.Commit(ctx, owner.CommitRequest{
		CheckpointID:  req.CheckpointID,
		CheckpointDir: req.CheckpointDir,
		Scope:         scope,
		Stop:          req.Stop,
		Episodes:      episodes,
		// No deadline: the export outlives the caller's deadline_ts, and a
		// retry awaits it (the owner's round timeout still bounds it).
	})
	if err != nil {
		if errors.Is(err, snapshotindex.ErrConflict) {
			return control.CommitResult{}, control.ErrCheckpointConflict.Wrap(err)
		}
		if errors.Is(err, owner.ErrCommitStopped) {
			return control.CommitResult{}, control.ErrStaleCheckpoint.Wrap(err)
		}
		if errors.Is(err, records.ErrInvalidState) {
			return control.CommitResult{}, control.ErrInvalidCheckpointState.Wrap(err)
		}
		return control.CommitResult{}, problem.Wrap(problem.StatusInternal, CodeCommitFailed, err)
	}
	out := control.CommitResult{Manifest: manifestOf(req.CheckpointID, res), EpisodeIDs: []string{}}
	for _, sid := range res.Sessions {
		if k, ok := episodes[sid]; ok {
			out.EpisodeIDs = append(out.EpisodeIDs, k)
		} else if e, ok := p.BoundEpisode(sid); ok {
			// A retried commit reports the records as first written.
			out.EpisodeIDs = append(out.EpisodeIDs, e.CaptureKey())
		}
	}
	sort.Strings(out.EpisodeIDs)
	for _, sid := range res.Parked {
		out.Parked = append(out.Parked, episodes[sid])
		p.Unbind(sid)
	}
	sort.Strings(out.Parked)
	for _, sid := range unclaimed {
		// delete_restored, not a retire: no attempt is fenced, and the
		// snapshot stays for the checkpoint that names it.
		if err := p.own.EndSessionSandbox(ctx, sid); err != nil {
			p.log.WithError(err).WithField("session_id", sid).Warn("could not stop a restored session the commit left out")
			continue
		}
		p.Unbind(sid)
	}
	return out, nil
}

func (h hooks) Restore(ctx context.Context, req control.RestoreRequest) (control.RestoreResult, error) {
	p := h.Participant
	live, err := p.own.Sessions()
	if err != nil {
		return control.RestoreResult{}, err
	}
	p.mu.Lock()
	if len(live) == 0 && p.mode == owner.ModeExported {
		// Sessions the owner ended on its own (an idle end) are bound no
		// more: with no sandbox live, no session of an exporting server is.
		clear(p.bound)
		clear(p.pending)
	}
	bound := len(p.bound)
	p.mu.Unlock()
	if len(live) > 0 || bound > 0 || p.gate.Inflight() > 0 {
		return control.RestoreResult{}, control.ErrInvalidPhase.With("restore needs a process with no live sessions (%d sessions, %d requests in flight)", max(len(live), bound), p.gate.Inflight())
	}
	if p.mode == owner.ModeRestartOnly {
		// Nothing of this server is ever in a checkpoint: its episodes
		// restart from their inputs. The controller's directory must still
		// be there: a restore from a checkpoint that is gone is refused.
		if req.CheckpointDir != "" {
			if fi, err := os.Stat(req.CheckpointDir); err != nil || !fi.IsDir() {
				return control.RestoreResult{}, control.ErrInvalidCheckpointState.With("checkpoint_dir %q is not a readable directory", req.CheckpointDir)
			}
		}
		return control.RestoreResult{SourceCheckpointID: req.SourceCheckpointID, Restored: []string{}}, nil
	}
	// The owner reads the index once: it finds the checkpoint (by id or
	// by dir), checks its dir, and installs the records of these episodes.
	res, err := p.own.Restore(ctx, owner.RestoreRequest{
		CheckpointID:  req.SourceCheckpointID,
		CheckpointDir: req.CheckpointDir,
		Episodes:      control.CaptureKeys(req.EpisodeIDs),
	})
	if err != nil {
		if errors.Is(err, owner.ErrInvalidRecord) || errors.Is(err, owner.ErrUnknownCheckpoint) {
			return control.RestoreResult{}, control.ErrInvalidCheckpointState.Wrap(err)
		}
		return control.RestoreResult{}, problem.Wrap(problem.StatusInternal, CodeRestoreFailed, err)
	}
	out := control.RestoreResult{SourceCheckpointID: res.CheckpointID, Restored: []string{}}
	next := map[string]control.EpisodeID{}
	for _, rs := range res.Sessions {
		// Records are chosen by the requested capture keys, so their
		// labels parse.
		e, err := control.ParseCaptureKey(rs.Episode)
		if err != nil {
			return control.RestoreResult{}, control.ErrInvalidCheckpointState.With("record of session %s names episode %q: %v", rs.SessionID, rs.Episode, err)
		}
		next[rs.SessionID] = e.Next()
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

func (h hooks) Retire(ctx context.Context, eps []control.EpisodeID) error {
	p := h.Participant
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
		return fail(problem.Wrap(problem.StatusInternal, CodeRetireFailed, err), res.Failed)
	}
	p.log.WithFields(logrus.Fields{"episodes": control.CaptureKeys(eps), "sessions": len(sessions)}).Info("retired attempts")
	return nil
}

func (h hooks) StopWriter(id string) { h.own.StopCommit(id) }

func (h hooks) Forget(rolloutIDs []string) {
	p := h.Participant
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

// ReleaseRequest is the body of the release route.
type ReleaseRequest struct {
	KeptCheckpointIDs *[]string `json:"kept_checkpoint_ids"`
}

// CheckRetentionRequest is check_retention's body: an empty object.
type CheckRetentionRequest struct{}

// CheckRetentionReply answers check_retention.
type CheckRetentionReply struct {
	FollowDirs bool              `json:"follow_dirs"`
	Dropped    []string          `json:"dropped"`
	Deleted    []string          `json:"deleted"`
	Deferred   []string          `json:"deferred"`
	Failed     map[string]string `json:"failed,omitempty"`
	// Pending are the checkpoints whose directory was seen gone, not yet
	// for the grace; Unreadable those whose directory could not be read.
	Pending    []DirSeen `json:"pending"`
	Unreadable []DirSeen `json:"unreadable"`
}

// DirSeen is a checkpoint whose directory a check saw gone or could not
// read.
type DirSeen struct {
	CheckpointID  string   `json:"checkpoint_id"`
	CheckpointDir string   `json:"checkpoint_dir"`
	GoneSince     *float64 `json:"gone_since,omitempty"`
	Reason        string   `json:"reason,omitempty"`
	Error         string   `json:"error,omitempty"`
}

// CheckRetention checks the checkpoint directories now, as the period
// does: a checkpoint whose directory is gone for the grace is dropped and
// its snapshots deleted as a release's.
func (p *Participant) CheckRetention(ctx context.Context, _ CheckRetentionRequest) (any, error) {
	res, err := p.own.CheckRetention(ctx)
	rep := CheckRetentionReply{
		FollowDirs: p.own.RetentionStatus().FollowDirs,
		Dropped:    nonNil(res.Dropped), Deleted: nonNil(res.Deleted), Deferred: nonNil(res.Deferred), Failed: res.Failed,
		Pending: []DirSeen{}, Unreadable: []DirSeen{},
	}
	for _, s := range res.Pending {
		since := float64(s.Since.UnixNano()) / 1e9
		rep.Pending = append(rep.Pending, DirSeen{CheckpointID: s.ID, CheckpointDir: s.Dir, GoneSince: &since})
	}
	for _, s := range res.Unreadable {
		rep.Unreadable = append(rep.Unreadable, DirSeen{CheckpointID: s.ID, CheckpointDir: s.Dir, Reason: s.Reason, Error: s.Detail})
	}
	if err != nil {
		e := problem.Wrap(problem.StatusInternal, CodeRetentionFailed, err)
		e.Detail += fmt.Sprintf(" (dropped %s; the next check deletes the rest)", strings.Join(rep.Dropped, ", "))
		return nil, e
	}
	return rep, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// ReleaseReply answers release.
type ReleaseReply struct {
	Kept     []string          `json:"kept_checkpoint_ids"`
	Dropped  []string          `json:"dropped"`
	Deleted  []string          `json:"deleted"`
	Deferred []string          `json:"deferred"`
	Failed   map[string]string `json:"failed,omitempty"`
}

// Release drops every checkpoint not kept and deletes the snapshots no kept
// checkpoint needs.
func (p *Participant) Release(ctx context.Context, req ReleaseRequest) (any, error) {
	if req.KeptCheckpointIDs == nil {
		// Required, so that an empty body cannot drop every checkpoint.
		return nil, resources.Invalid("kept_checkpoint_ids is required (an empty list keeps none)")
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
	rep := ReleaseReply{Kept: kept, Dropped: nonNil(res.Dropped), Deleted: nonNil(res.Deleted), Deferred: nonNil(res.Deferred), Failed: res.Failed}
	if err != nil {
		e := problem.Wrap(problem.StatusInternal, CodeReleaseFailed, err)
		e.Detail += fmt.Sprintf(" (dropped %s; a retry deletes the rest)", strings.Join(rep.Dropped, ", "))
		return nil, e
	}
	return rep, nil
}
