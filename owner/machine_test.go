package owner

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/internal/racebuild"
	"github.com/sandboxowner/owner/internal/script"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/records"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/snapshotindex"
)

// The scripts under testdata/ drive the owner's operation machines alone:
// a command is a machine's construction or an input (the outcome of the
// effect it asked for last); the output is the effects it returns and what
// it waits for next. The server's name in them is "notes" and this run's
// incarnation "now".

func scriptErr(c *script.Case) error {
	if v, ok := c.Args["err"]; ok {
		return errors.New(v)
	}
	return nil
}

// failures reads failed=a:why,b:why.
func failures(c *script.Case, key string) map[string]string {
	ws := c.List(key)
	if ws == nil {
		return nil
	}
	out := map[string]string{}
	for _, w := range ws {
		id, why, _ := strings.Cut(w, ":")
		out[id] = why
	}
	return out
}

// pairs reads the bare key=value words other than the named ones, sorted
// by key.
func pairs(c *script.Case, skip ...string) [][2]string {
	var out [][2]string
	for _, k := range slices.Sorted(maps.Keys(c.Args)) {
		if !slices.Contains(skip, k) {
			out = append(out, [2]string{k, c.Args[k]})
		}
	}
	return out
}

// checkpointsArg reads id=dir words (dir may be empty).
func checkpointsArg(c *script.Case, skip ...string) []snapshotindex.CheckpointMeta {
	var all []snapshotindex.CheckpointMeta
	for _, p := range pairs(c, skip...) {
		all = append(all, snapshotindex.CheckpointMeta{ID: p[0], CheckpointDir: p[1]})
	}
	return all
}

// refsArg reads snapshot=ckpt+ckpt words.
func refsArg(c *script.Case) map[string][]string {
	refs := map[string][]string{}
	for _, p := range pairs(c, "err") {
		refs[p[0]] = strings.Split(p[1], "+")
	}
	return refs
}

// snapshotsArg reads id=owner/incarnation words.
func snapshotsArg(c *script.Case) []provider.SnapshotInfo {
	var out []provider.SnapshotInfo
	for _, p := range pairs(c, "err") {
		name, inc, _ := strings.Cut(p[1], "/")
		out = append(out, provider.SnapshotInfo{ID: p[0], Metadata: map[string]string{LabelOwner: name, LabelIncarnation: inc}})
	}
	return out
}

// dropsArg reads drops=c1:s1+s2,c2: (a checkpoint with the snapshots only
// it named).
func dropsArg(c *script.Case) []dropped {
	var out []dropped
	for _, w := range c.List("drops") {
		id, snaps, _ := strings.Cut(w, ":")
		d := dropped{ID: id, Dir: "/d/" + id}
		if snaps != "" {
			d.Snapshots = strings.Split(snaps, "+")
		}
		out = append(out, d)
	}
	return out
}

// commonInput reads the inputs every machine shares; ok is false for a
// command that is none of them.
func commonInput(c *script.Case) (input, bool) {
	switch c.Cmd {
	case "start":
		return inStart{}, true
	case "checkpoints":
		return inCheckpoints{All: checkpointsArg(c, "err"), Err: scriptErr(c)}, true
	case "refs":
		return inRefs{Refs: refsArg(c), Err: scriptErr(c)}, true
	case "written":
		return inWritten{Err: scriptErr(c)}, true
	case "tombstones":
		return inTombstones{IDs: c.List("ids"), Err: scriptErr(c)}, true
	case "deleted":
		return inDeleted{Deleted: c.List("ok"), InUse: c.List("in-use"), Failed: failures(c, "failed")}, true
	case "kept":
		var err error
		if c.Has("missing") {
			err = snapshotindex.ErrNotFound
		}
		return inKept{Missing: c.Args["missing"], Err: err}, true
	case "snapshots":
		return inSnapshots{Snaps: snapshotsArg(c), Err: scriptErr(c)}, true
	}
	return nil, false
}

func effects(es []effect) string {
	var b strings.Builder
	for _, e := range es {
		if _, ok := e.(effDone); ok {
			fmt.Fprintf(&b, "%s\n", e)
			continue
		}
		fmt.Fprintf(&b, "effect: %s\n", e)
	}
	return b.String()
}

func failedText(f map[string]string) string {
	if f == nil {
		return "-"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(f)) {
		parts = append(parts, k+":"+f[k])
	}
	return bracket(parts)
}

// scripted runs the scripts of glob against one machine: a command that
// make takes makes a new one and starts it; any other is an input. Each
// prints the effects of the step and state(m).
func scripted[M machine](t *testing.T, glob string, make func(c *script.Case) (M, bool), state func(m M) string) {
	script.Run(t, glob, func(t *testing.T) func(c *script.Case) string {
		var m M
		return func(c *script.Case) string {
			var in input = inStart{}
			if made, ok := make(c); ok {
				m = made
			} else if in, ok = machineInput(t, c); !ok {
				t.Fatalf("%s: unknown command %q", c.Pos, c.Cmd)
			}
			return effects(m.step(in)) + state(m)
		}
	})
}

// TestReleaseScripts runs testdata/release/*.txt against the reclaim
// machine: a release, a drop of checkpoints whose directory is gone, and
// the deletes after such a drop.
func TestReleaseScripts(t *testing.T) {
	scripted(t, "testdata/release/*.txt", func(c *script.Case) (*reclaim, bool) {
		switch c.Cmd {
		case "release":
			return newRelease(c.List("kept"), toSet(c.List("needed")), c.Has("leftovers"), "notes", "now"), true
		case "dir-drop":
			return newDirDrop(checkpointsArg(c, "kept"), c.List("kept")), true
		case "drop-delete":
			return newDropDelete(dropsArg(c), toSet(c.List("needed"))), true
		}
		return nil, false
	}, func(m *reclaim) string {
		r := m.res
		return fmt.Sprintf("state: waiting=%s dropped=%s deleted=%s deferred=%s failed=%s",
			m.phase, bracket(r.Dropped), bracket(r.Deleted), bracket(r.Deferred), failedText(r.Failed))
	})
}

var scriptT0 = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)

// at reads at=seconds after scriptT0 (0 when absent).
func at(t *testing.T, c *script.Case, key string) time.Time {
	v, ok := c.Args[key]
	if !ok {
		return scriptT0
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s: %s=%q: %v", c.Pos, key, v, err)
	}
	return scriptT0.Add(time.Duration(n) * time.Second)
}

// snapRecords reads session:snapshot@episode words (the episode is
// optional): records of provider "fake" whose sandbox is sb-<session>.
func snapRecords(c *script.Case, key string) []snapshotindex.Record {
	var out []snapshotindex.Record
	for _, w := range c.List(key) {
		sid, rest, _ := strings.Cut(w, ":")
		snap, ep, _ := strings.Cut(rest, "@")
		out = append(out, snapshotindex.Record{SessionID: sid, SnapshotID: snap, Episode: ep, Provider: "fake", Sandbox: provider.Handle{SandboxID: "sb-" + sid}})
	}
	return out
}

// machineInput reads the inputs of every machine.
func machineInput(t *testing.T, c *script.Case) (input, bool) {
	switch c.Cmd {
	case "checkpoint":
		if c.Has("missing") {
			return inCheckpoint{Err: fmt.Errorf("checkpoint: %w", snapshotindex.ErrNotFound)}, true
		}
		// bad-data: sessions whose data is no JSON object; good-data:
		// sessions with an object; other-provider: sessions taken on
		// provider "other".
		recs := snapRecords(c, "records")
		for i := range recs {
			switch sid := recs[i].SessionID; {
			case slices.Contains(c.List("bad-data"), sid):
				recs[i].Data = []byte(`"not an object"`)
			case slices.Contains(c.List("good-data"), sid):
				recs[i].Data = []byte(`{"k":1}`)
			}
			if slices.Contains(c.List("other-provider"), recs[i].SessionID) {
				recs[i].Provider = "other"
			}
			// ttl: sessions whose sandbox lives a minute.
			if slices.Contains(c.List("ttl"), recs[i].SessionID) {
				recs[i].Spec.TTLSeconds = 60
			}
		}
		return inCheckpoint{Ck: snapshotindex.Checkpoint{Meta: snapshotindex.CheckpointMeta{ID: c.Args["id"], CheckpointDir: c.Args["dir"], Seq: 1}, Records: recs}, Err: scriptErr(c)}, true
	case "dir":
		return inDir{Gone: c.Has("gone")}, true
	case "dir-records":
		// No id and no err: the dir holds no manifest of this server's.
		return inDirRecords{ID: c.Args["id"], Records: snapRecords(c, "records"), NoManifest: !c.Has("id") && !c.Has("err"), Err: scriptErr(c)}, true
	case "found":
		return inFound{Meta: snapshotindex.CheckpointMeta{ID: c.Args["id"]}, OK: c.Has("id"), Err: scriptErr(c)}, true
	case "forked":
		// forks=fork-a,-: one per record, - where it failed.
		var forks []provider.Handle
		for _, id := range c.List("forks") {
			if id == "-" {
				id = ""
			}
			forks = append(forks, provider.Handle{SandboxID: id})
		}
		// at=T,U: when each fork returned (one T: every fork).
		when := make([]time.Time, len(forks))
		ats := c.List("at")
		for i := range when {
			when[i] = scriptT0
			if len(ats) > 0 {
				n, err := strconv.Atoi(ats[min(i, len(ats)-1)])
				if err != nil {
					t.Fatalf("%s: at: %v", c.Pos, err)
				}
				when[i] = scriptT0.Add(time.Duration(n) * time.Second)
			}
		}
		return inForked{Forks: forks, At: when, Failed: failures(c, "failed"), Missing: c.List("missing")}, true
	case "installed":
		// errs=-,taken,?: one per session, - where it was installed, ?
		// where no answer came; closed: the owner closed first.
		if c.Has("closed") {
			return inInstalled{Err: ErrClosed}, true
		}
		var errs []error
		for _, e := range c.List("errs") {
			switch e {
			case "-":
				errs = append(errs, nil)
			case "?":
				errs = append(errs, errNoAnswer)
			default:
				errs = append(errs, errors.New(e))
			}
		}
		return inInstalled{Errs: errs}, true
	case "writer":
		in := inWriter{Stopped: c.Has("stopped"), Err: scriptErr(c)}
		if c.Has("unstored") {
			in.Unstored = &unstoredCommit{
				tag: "tag0", taken: []messages.SnapshotReply{{SessionID: "a", SnapshotID: "sa"}},
				meta:    snapshotindex.CheckpointMeta{ID: c.Args["unstored"], CheckpointDir: c.Args["dir"], Scope: c.List("scope")},
				records: snapRecords(c, "records"), skipped: c.List("skipped"), began: scriptT0,
			}
		}
		return in, true
	case "manifest":
		return inManifest{M: records.Manifest{CheckpointID: c.Args["id"]}, Err: scriptErr(c)}, true
	case "published":
		return inPublished{M: records.Manifest{CheckpointID: c.Args["id"]}, Err: scriptErr(c), Now: at(t, c, "at")}, true
	case "sessions":
		var refs []messages.SessionRef
		for _, id := range c.List("ids") {
			refs = append(refs, messages.SessionRef{SessionID: id})
		}
		return inSessions{Refs: refs, Err: scriptErr(c)}, true
	case "round-no":
		n, _ := strconv.ParseUint(c.Args["n"], 10, 64)
		return inRoundNo{N: n, Now: at(t, c, "at")}, true
	case "round":
		if err := scriptErr(c); err != nil {
			return inRound{Err: err}, true
		}
		rr := &actors.RoundResult{Skipped: c.List("skipped"), Failed: failures(c, "failed")}
		for _, r := range snapRecords(c, "taken") {
			rr.Taken = append(rr.Taken, messages.SnapshotReply{SessionID: r.SessionID, SnapshotID: r.SnapshotID,
				Sandbox: sandbox.Sandbox{Handle: provider.Handle{SandboxID: "sb-" + r.SessionID}, Spec: provider.Spec{Image: "img", Files: map[string]string{"/seed": "x"}}}})
		}
		return inRound{R: rr, Now: at(t, c, "at")}, true
	case "stored":
		// invalid: the index refuses the records as invalid.
		err := scriptErr(c)
		if c.Has("invalid") {
			err = fmt.Errorf("%w: %s", snapshotindex.ErrInvalid, c.Args["invalid"])
		}
		return inStored{Meta: snapshotindex.CheckpointMeta{ID: c.Args["id"], Seq: 2}, Err: err}, true
	case "parked":
		return inParked{Parked: c.List("ok"), Failed: failures(c, "failed")}, true
	case "intents":
		// list=kind/id/tag: a tag "bad" is a body that is no JSON.
		var ins []snapshotindex.Intent
		for _, w := range c.List("list") {
			parts := strings.SplitN(w+"//", "/", 4)
			body := commitIntentBody(parts[2])
			if parts[2] == "bad" {
				body = []byte("{")
			}
			ins = append(ins, snapshotindex.Intent{Kind: parts[0], ID: parts[1], Body: body})
		}
		return inIntents{Intents: ins, Err: scriptErr(c)}, true
	case "listed":
		return inListed{IDs: c.List("ids")}, true
	case "sandboxes":
		var list []provider.SandboxInfo
		for _, p := range pairs(c, "err") {
			name, inc, _ := strings.Cut(p[1], "/")
			list = append(list, provider.SandboxInfo{Handle: provider.Handle{SandboxID: p[0]}, Metadata: map[string]string{LabelOwner: name, LabelIncarnation: inc}})
		}
		return inSandboxes{List: list, Err: scriptErr(c)}, true
	case "stopped":
		return inStopped{Stopped: c.List("ok"), Failed: failures(c, "failed")}, true
	case "turn":
		return inTurn{Err: scriptErr(c)}, true
	}
	if in, ok := seedInput(c); ok {
		return in, true
	}
	return commonInput(c)
}

// TestCommitScripts runs testdata/commit/*.txt against the commit machine:
// "commit" makes one (deadline= seconds after the script's start; the
// round timeout is ten minutes; on-stop=none leaves a stop's sandboxes).
func TestCommitScripts(t *testing.T) {
	scripted(t, "testdata/commit/*.txt", func(c *script.Case) (*committing, bool) {
		if c.Cmd != "commit" {
			return nil, false
		}
		req := CommitRequest{CheckpointID: c.Args["id"], CheckpointDir: c.Args["dir"], Scope: c.List("scope"), Stop: c.Has("stop")}
		if c.Has("deadline") {
			req.Deadline = at(t, c, "deadline")
		}
		for _, w := range c.List("episodes") {
			sid, ep, _ := strings.Cut(w, ":")
			if req.Episodes == nil {
				req.Episodes = map[string]string{}
			}
			req.Episodes[sid] = ep
		}
		return newCommitting(req, "fake", c.Args["on-stop"] != OnStopNone, 10*time.Minute, "now"), true
	}, func(m *committing) string {
		r := m.res
		return fmt.Sprintf("state: waiting=%s existing=%v meta=%s/%d sessions=%s skipped=%s parked=%s park-failed=%s manifest=%s",
			m.phase, r.Existing, r.Meta.ID, r.Meta.Seq, bracket(r.Sessions), bracket(r.Skipped), bracket(r.Parked), failedText(r.ParkFailed), r.Manifest.CheckpointID)
	})
}

// TestRecoverScripts runs testdata/recover/*.txt against the recovery
// machine: "recover" makes one (no-index: an owner that does not export;
// no-list: a provider that cannot list).
func TestRecoverScripts(t *testing.T) {
	scripted(t, "testdata/recover/*.txt", func(c *script.Case) (*recovering, bool) {
		if c.Cmd != "recover" {
			return nil, false
		}
		return newRecovering(!c.Has("no-index"), !c.Has("no-list"), "notes", "now"), true
	}, func(m *recovering) string { return "state: waiting=" + m.phase.String() })
}

// TestRestoreScripts runs testdata/restore/*.txt against the restore
// machine: "restore" makes one (provider "fake").
func TestRestoreScripts(t *testing.T) {
	scripted(t, "testdata/restore/*.txt", func(c *script.Case) (*restoring, bool) {
		if c.Cmd != "restore" {
			return nil, false
		}
		return newRestoring(RestoreRequest{CheckpointID: c.Args["id"], CheckpointDir: c.Args["dir"], Sessions: c.List("sessions"), Episodes: c.List("episodes")}, "fake", labeller{owner: "notes", incarnation: "now"}), true
	}, func(m *restoring) string {
		var sessions []string
		for _, s := range m.res.Sessions {
			sessions = append(sessions, s.SessionID)
		}
		return fmt.Sprintf("state: waiting=%s checkpoint=%s sessions=%s superseded=%s supersede-failed=%s",
			m.phase, m.res.CheckpointID, bracket(sessions), bracket(m.res.Superseded), failedText(m.res.SupersedeFailed))
	})
}

// TestRetireScripts runs testdata/retire/*.txt against the retire machine:
// "retire" makes one.
func TestRetireScripts(t *testing.T) {
	scripted(t, "testdata/retire/*.txt", func(c *script.Case) (*retiring, bool) {
		if c.Cmd != "retire" {
			return nil, false
		}
		return newRetiring(c.List("sessions")), true
	}, func(m *retiring) string {
		return fmt.Sprintf("state: waiting=%s stopped=%s failed=%s", m.phase, bracket(m.res.Stopped), failedText(m.res.Failed))
	})
}

// TestDiscardScripts runs testdata/discard/*.txt against the discard
// machine: "discard" makes one (taken=session:snapshot words, round: a
// commit round's).
func TestDiscardScripts(t *testing.T) {
	scripted(t, "testdata/discard/*.txt", func(c *script.Case) (*discarding, bool) {
		if c.Cmd != "discard" {
			return nil, false
		}
		d := discard{Tag: c.Args["tag"], Late: c.List("late"), Reason: c.Args["reason"]}
		for _, r := range snapRecords(c, "taken") {
			d.Taken = append(d.Taken, messages.SnapshotReply{SessionID: r.SessionID, SnapshotID: r.SnapshotID})
		}
		d.Round = c.Has("round")
		return newDiscarding(d), true
	}, func(m *discarding) string { return "state: waiting=" + m.phase.String() })
}

// TestSeedScripts runs testdata/seed/*.txt against the seed machine:
// "seed" makes one. "start-reply" answers the spawn and start: pid=P [new]
// is the actor the supervisor handed the start to (new: it made it), and
// sandbox=ID or rep-err=ended|exists|other that actor's answer;
// "refused err=E" the supervisor's refusal; err= an ask that got no answer;
// undelivered one that reached no actor (a dead letter; without pid=, the
// supervisor was gone).
func TestSeedScripts(t *testing.T) {
	scripted(t, "testdata/seed/*.txt", func(c *script.Case) (*seeding, bool) {
		if c.Cmd != "seed" {
			return nil, false
		}
		limit, _ := strconv.Atoi(c.Args["limit"])
		return newSeeding(c.Args["session"], limit, messages.StartSandbox{}), true
	}, func(m *seeding) string {
		return fmt.Sprintf("state: waiting=%s attempt=%d sandbox=%s", m.phase, m.attempt, m.sb.Handle.SandboxID)
	})
}

// seedInput reads the inputs of the seed machine.
func seedInput(c *script.Case) (input, bool) {
	switch c.Cmd {
	case "start-reply":
		if c.Has("refused") {
			return inStartReply{Ref: &messages.SessionRef{Err: scriptErr(c)}}, true
		}
		if err := scriptErr(c); err != nil {
			return inStartReply{Err: err}, true
		}
		var ref *messages.SessionRef
		if pid, ok := c.Args["pid"]; ok {
			ref = &messages.SessionRef{PID: pid, Spawned: c.Has("new")}
		}
		if c.Has("undelivered") {
			to := "sup"
			if ref != nil {
				to = c.Args["pid"]
			}
			return inStartReply{Ref: ref, Err: fmt.Errorf("actor %s: %w", to, actor.ErrDeadLetter)}, true
		}
		rep := &messages.StartReply{}
		switch c.Args["rep-err"] {
		case "":
			rep.Sandbox = sandbox.Sandbox{Handle: provider.Handle{SandboxID: c.Args["sandbox"]}}
		case "ended":
			rep.Err = actors.ErrSessionEnded
		case "exists":
			rep.Err = sandbox.ErrExists
		default:
			rep.Err = errors.New(c.Args["rep-err"])
		}
		return inStartReply{Ref: ref, Rep: rep}, true
	}
	return nil, false
}

// A seed's steps reuse one effects buffer: its spawn's effect is the one
// allocation of a seed that starts at the first attempt (two slices and a
// boxed effDone were three more).
func TestSeedStepsReuseTheirBuffer(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("allocation counts differ under -race")
	}
	var start, reply input = inStart{}, inStartReply{Ref: &messages.SessionRef{PID: "a", Spawned: true}, Rep: &messages.StartReply{}}
	m := newSeeding("s1", 0, messages.StartSandbox{})
	n := testing.AllocsPerRun(100, func() {
		*m = seeding{sessionID: "s1"}
		m.step(start)
		if es := m.step(reply); len(es) != 1 || es[0] != (effDone{}) {
			t.Fatalf("effects %v, want done", es)
		}
	})
	if n > 1 {
		t.Fatalf("%v allocations a seed, want 1", n)
	}
}

// A seed that finds the session's actor on its way out every time gives
// up after maxSeedAttempts spawns, with the actor's answer.
func TestSeedGivesUpOnAnActorAlwaysOnItsWayOut(t *testing.T) {
	m := newSeeding("s1", 0, messages.StartSandbox{})
	spawns := 0
	in := input(inStart{})
	for range 3 * maxSeedAttempts {
		var next input
		for _, e := range m.step(in) {
			switch e := e.(type) {
			case effSpawnStart:
				spawns++
				next = inStartReply{Ref: &messages.SessionRef{PID: "a"}, Rep: &messages.StartReply{Err: actors.ErrSessionEnded}}
			case effDone:
				if !errors.Is(e.Err, actors.ErrSessionEnded) || spawns != maxSeedAttempts {
					t.Fatalf("done with %v after %d spawns, want ErrSessionEnded after %d", e.Err, spawns, maxSeedAttempts)
				}
				return
			}
		}
		in = next
	}
	t.Fatalf("still seeding after %d spawns", spawns)
}
