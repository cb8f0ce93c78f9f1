package owner

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A commit round's snapshot names carry their incarnation's mark, and only
// they match it: not another incarnation's rounds, not a template's
// snapshot (its tag is a round's tag alone), not a name of someone else's.
func TestHasMark(t *testing.T) {
	mark := roundsMark("inc-a")
	tag := commitTag("inc-a", "c1", 3)
	if !strings.HasPrefix(tag, mark) || len(tag) != len(mark)+8 || len(mark) != 16 {
		t.Fatalf("commit tag %q of mark %q", tag, mark)
	}
	if tag == commitTag("inc-a", "c1", 4) || tag == commitTag("inc-a", "c2", 3) {
		t.Errorf("two rounds share the tag %q", tag)
	}
	names := map[string]string{
		"own round":           snapshotName("s1", 1796292000, tag),
		"own, other round":    snapshotName("s1-x", 1, commitTag("inc-a", "c9", 1)),
		"other incarnation":   snapshotName("s1", 1796292000, commitTag("inc-b", "c1", 3)),
		"template":            "ng-template-k-" + roundTag("inc-a", "template/k", 1),
		"unmarked round":      snapshotName("s1", 1, roundTag("inc-a", "c1", 3)),
		"foreign":             "backup-" + tag,
		"one digit short":     "ng-s1-1-" + tag[:len(tag)-1],
		"one digit more":      "ng-s1-1-" + tag + "0",
		"no dash":             "ng" + tag,
		"the mark alone":      "ng-s1-1-" + mark,
		"mark not at the tag": "ng-" + tag + "-1",
	}
	got := map[string]bool{}
	for what, name := range names {
		got[what] = hasMark(name, mark)
	}
	want := map[string]bool{
		"own round": true, "own, other round": true, "other incarnation": false, "template": false,
		"unmarked round": false, "foreign": false, "one digit short": false, "one digit more": false,
		"no dash": false, "the mark alone": false, "mark not at the tag": false,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("hasMark (-want +got):\n%s", diff)
	}
}

// A snapshot's name keeps the first 16 characters of its session's id, and
// of them only letters, digits and "-_." (each range to its ends); any other
// character, the ones just outside each range among them, becomes "_".
func TestSnapshotNameKeepsSafeCharacters(t *testing.T) {
	tag := commitTag("inc-a", "c1", 3)
	got := map[string]string{
		"range ends":    snapshotName("aAzZ09-_.", 5, tag),
		"just outside":  snapshotName("`{@[/:é ", 5, tag),
		"sixteen, cut":  snapshotName("0123456789abcdefXYZ", 5, tag),
		"cut on unsafe": snapshotName("0123456789abcde/é", 5, tag),
	}
	want := map[string]string{
		"range ends":    "ng-aAzZ09-_.-5-" + tag,
		"just outside":  "ng-________-5-" + tag,
		"sixteen, cut":  "ng-0123456789abcdef-5-" + tag,
		"cut on unsafe": "ng-0123456789abcde_-5-" + tag,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("snapshotName (-want +got):\n%s", diff)
	}
}
