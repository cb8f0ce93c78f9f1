package owner

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/snapshotindex"
)

// The decisions of the checkpoint operations, kept pure so that they can be
// tested without a provider or an index.

// intentCommit is the kind of intent earlier versions wrote before each
// commit's snapshots: a start still settles one it finds. Intents of kinds
// other than these three found at startup (a restore's, written by earlier
// versions) are dropped.
const intentCommit = "commit"

// intentRounds is an incarnation's standing intent, written at its start
// before any commit can run: its body's tag is the mark that begins the tag
// of every commit round the incarnation takes, so that a crash mid-round
// leaves snapshots the next start finds by name without a write on the
// commit's path. A clean Close drops it once every round is accounted for
// (recorded or tombstoned).
const intentRounds = "rounds"

// intentTemplate is a template's build between its snapshot and the
// template's record (which clears it); its body is a commitIntent whose
// tag ends the snapshot's name.
const intentTemplate = "template"

// commitIntent is the body of a commit intent: the tag that ends the name
// of every snapshot the round takes, so that a crash mid-round can find them.
type commitIntent struct {
	Tag string `json:"tag"`
}

func shortHash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:4])
}

// roundTag ends the names of a commit round's snapshots. It is unique per
// owner incarnation, checkpoint and round, so a cleanup by tag never
// touches another round's snapshots.
func roundTag(incarnation, checkpointID string, round uint64) string {
	return shortHash(fmt.Sprintf("%s/%s/%d", incarnation, checkpointID, round))
}

// roundsMark begins the tag of every commit round of an incarnation: 16 hex
// digits, so that no other incarnation's rounds share it.
func roundsMark(incarnation string) string {
	sum := sha256.Sum256([]byte("rounds/" + incarnation))
	return hex.EncodeToString(sum[:8])
}

// commitTag is a commit round's tag: the incarnation's mark, then the
// round's own tag.
func commitTag(incarnation, checkpointID string, round uint64) string {
	return roundsMark(incarnation) + roundTag(incarnation, checkpointID, round)
}

// hasMark reports whether a snapshot name is a commit round's of the
// incarnation whose mark is mark: its tag (what follows the last '-') is
// the mark and a round's tag. Names of other rounds (a template's tag is a
// round's tag alone) never match.
func hasMark(name, mark string) bool {
	if !strings.HasPrefix(name, "ng-") {
		return false
	}
	tag := name[strings.LastIndexByte(name, '-')+1:]
	return len(tag) == len(mark)+8 && strings.HasPrefix(tag, mark)
}

// snapshotName is upstream's ng-<session[:16]>-<unix seconds>, followed by
// the round's tag.
func snapshotName(sessionID string, unix int64, tag string) string {
	safe := []rune{}
	for _, r := range sessionID {
		if len(safe) == 16 {
			break
		}
		if r == '-' || r == '_' || r == '.' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			safe = append(safe, r)
		} else {
			safe = append(safe, '_')
		}
	}
	return fmt.Sprintf("ng-%s-%d-%s", string(safe), unix, tag)
}

// hasTag reports whether a snapshot name belongs to the round of tag.
func hasTag(name, tag string) bool {
	return strings.HasPrefix(name, "ng-") && strings.HasSuffix(name, "-"+tag)
}

// inScope filters sessions to scope (nil scope: all).
func inScope[T any](items []T, id func(T) string, scope []string) []T {
	if scope == nil {
		return items
	}
	want := make(map[string]bool, len(scope))
	for _, s := range scope {
		want[s] = true
	}
	var out []T
	for _, it := range items {
		if want[id(it)] {
			out = append(out, it)
		}
	}
	return out
}

// validateRecords checks every record of a checkpoint before a restore
// touches the provider. live is the set of sessions this owner holds.
func validateRecords(records []snapshotindex.Record, providerName string, live map[string]bool) error {
	seen := map[string]bool{}
	var problems []string
	for i, r := range records {
		where := fmt.Sprintf("record %d (session %q)", i, r.SessionID)
		switch {
		case r.SessionID == "":
			problems = append(problems, fmt.Sprintf("record %d has no session id", i))
		case seen[r.SessionID]:
			problems = append(problems, where+" appears twice")
		case r.SnapshotID == "":
			problems = append(problems, where+" has no snapshot id")
		case r.Provider != providerName:
			problems = append(problems, fmt.Sprintf("%s was taken on provider %q, not %q", where, r.Provider, providerName))
		case live[r.SessionID]:
			problems = append(problems, where+" is live in this owner")
		}
		seen[r.SessionID] = true
		if len(r.Data) > 0 {
			if _, err := actors.ValidateSessionData(r.Data); err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", where, err))
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalidRecord, strings.Join(problems, "; "))
	}
	return nil
}

// releasePlan is what a release deletes.
type releasePlan struct {
	Drop       []string // checkpoints to drop from the index
	Tombstones []string // snapshots only dropped checkpoints name
}

// planRelease keeps the checkpoints in kept and drops the others; a
// snapshot is tombstoned when no kept checkpoint names it.
func planRelease(all []snapshotindex.CheckpointMeta, refs map[string][]string, kept []string) releasePlan {
	keep := map[string]bool{}
	for _, id := range kept {
		keep[id] = true
	}
	var p releasePlan
	for _, m := range all {
		if !keep[m.ID] {
			p.Drop = append(p.Drop, m.ID)
		}
	}
	for snap, ckpts := range refs {
		needed := false
		for _, c := range ckpts {
			if keep[c] {
				needed = true
				break
			}
		}
		if !needed {
			p.Tombstones = append(p.Tombstones, snap)
		}
	}
	sort.Strings(p.Drop)
	sort.Strings(p.Tombstones)
	return p
}
