package owner_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/snapshotindex"
)

// Close stops every session's sandbox; one that refuses to stop is left
// for the next start and told to the operator in one warning, which a
// clean close does not give.
func TestCloseStopsTheSessionsAndWarnsOfThoseItCouldNot(t *testing.T) {
	const warning = "some sandboxes could not be stopped at shutdown"
	for _, refuses := range []bool{false, true} {
		e := newEnv(t)
		o := e.open()
		s1 := seed(t, o, "s1")
		seed(t, o, "s2")
		if refuses {
			e.fk.FailNextFor(fake.OpStop, s1.Handle.SandboxID, 10)
		}
		if err := o.Close(); err != nil {
			t.Fatal(err)
		}
		var want []string
		if refuses {
			want = []string{s1.Handle.SandboxID}
		}
		if d := cmp.Diff(want, e.fk.LiveSandboxIDs(), cmpopts.EquateEmpty()); d != "" {
			t.Errorf("refusing %t: live after close (-want +got):\n%s", refuses, d)
		}
		n := 0
		if refuses {
			n = 1
		}
		if got := warnings(e.hook, warning); got != n {
			t.Errorf("refusing %t: %d warnings %q, want %d", refuses, got, warning, n)
		}
	}
}

// A clean Close drops the run's rounds intent; when the index refuses, the
// intent stays for the next start, which drops it, and the operator is
// warned.
func TestCloseThatCannotDropItsRoundsIntentLeavesItToTheNextStart(t *testing.T) {
	const warning = "could not drop this run's rounds intent"
	e := newEnv(t)
	mem := snapshotindex.NewMemory()
	st := &writeCountingStore{Store: mem.Open()}
	o1 := e.open(withStore(st))
	seed(t, o1, "s1")
	commit(t, o1, "c1")
	st.failDeletes.Store(1)
	if err := o1.Close(); err != nil {
		t.Fatal(err)
	}
	if in, _ := mem.Open().Intents(""); !onlyRoundsOf(in, o1) || len(in) != 1 || warnings(e.hook, warning) != 1 {
		t.Fatalf("after a close whose drop failed: intents %v, %d warnings; want o1's rounds intent and one warning", in, warnings(e.hook, warning))
	}
	o2 := e.open(withStore(mem.Open()))
	if err := o2.Close(); err != nil {
		t.Fatal(err)
	}
	if in, _ := mem.Open().Intents(""); len(in) != 0 || warnings(e.hook, warning) != 0 {
		t.Fatalf("after the next start's clean close: intents %v, %d warnings; want none", in, warnings(e.hook, warning))
	}
}
