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

	"github.com/sandboxowner/owner/actors"
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

// TestReleaseScripts runs testdata/release/*.txt against the reclaim
// machine: a release, a drop of checkpoints whose directory is gone, and
// the deletes after such a drop.
func TestReleaseScripts(t *testing.T) {
	script.Run(t, "testdata/release/*.txt", func(t *testing.T) func(c *script.Case) string {
		var m *reclaim
		return func(c *script.Case) string {
			var out []effect
			switch c.Cmd {
			case "release":
				m = newRelease(c.List("kept"), toSet(c.List("needed")), c.Has("leftovers"), "notes", "now")
				out = m.step(inStart{})
			case "dir-drop":
				m = newDirDrop(checkpointsArg(c, "kept"), c.List("kept"))
				out = m.step(inStart{})
			case "drop-delete":
				m = newDropDelete(dropsArg(c), toSet(c.List("needed")))
				out = m.step(inStart{})
			default:
				in, ok := commonInput(c)
				if !ok {
					t.Fatalf("%s: unknown command %q", c.Pos, c.Cmd)
				}
				out = m.step(in)
			}
			r := m.res
			return effects(out) + fmt.Sprintf("state: waiting=%s dropped=%s deleted=%s deferred=%s failed=%s",
				m.phase, bracket(r.Dropped), bracket(r.Deleted), bracket(r.Deferred), failedText(r.Failed))
		}
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

// snapRecords reads session:snapshot words.
func snapRecords(c *script.Case, key string) []snapshotindex.Record {
	var out []snapshotindex.Record
	for _, w := range c.List(key) {
		sid, snap, _ := strings.Cut(w, ":")
		out = append(out, snapshotindex.Record{SessionID: sid, SnapshotID: snap})
	}
	return out
}

// commitInput reads a commit's inputs.
func commitInput(t *testing.T, c *script.Case) (input, bool) {
	switch c.Cmd {
	case "checkpoint":
		if c.Has("missing") {
			return inCheckpoint{Err: fmt.Errorf("checkpoint: %w", snapshotindex.ErrNotFound)}, true
		}
		return inCheckpoint{Ck: snapshotindex.Checkpoint{Meta: snapshotindex.CheckpointMeta{ID: c.Args["id"], Seq: 1}, Records: snapRecords(c, "records")}, Err: scriptErr(c)}, true
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
		return inStored{Meta: snapshotindex.CheckpointMeta{ID: c.Args["id"], Seq: 2}, Err: scriptErr(c)}, true
	case "parked":
		return inParked{Parked: c.List("ok"), Failed: failures(c, "failed")}, true
	}
	return commonInput(c)
}

// TestCommitScripts runs testdata/commit/*.txt against the commit machine.
// "commit" makes one (deadline= seconds after the script's start; the
// round timeout is ten minutes; on-stop=none leaves a stop's sandboxes).
func TestCommitScripts(t *testing.T) {
	script.Run(t, "testdata/commit/*.txt", func(t *testing.T) func(c *script.Case) string {
		var m *committing
		return func(c *script.Case) string {
			var out []effect
			if c.Cmd == "commit" {
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
				m = newCommitting(req, "fake", c.Args["on-stop"] != OnStopNone, 10*time.Minute, "now")
				out = m.step(inStart{})
			} else {
				in, ok := commitInput(t, c)
				if !ok {
					t.Fatalf("%s: unknown command %q", c.Pos, c.Cmd)
				}
				out = m.step(in)
			}
			r := m.res
			return effects(out) + fmt.Sprintf("state: waiting=%s existing=%v meta=%s/%d sessions=%s skipped=%s parked=%s park-failed=%s manifest=%s",
				m.phase, r.Existing, r.Meta.ID, r.Meta.Seq, bracket(r.Sessions), bracket(r.Skipped), bracket(r.Parked), failedText(r.ParkFailed), r.Manifest.CheckpointID)
		}
	})
}
