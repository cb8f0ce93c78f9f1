package owner

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxowner/owner/internal/script"
	"github.com/sandboxowner/owner/provider"
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
