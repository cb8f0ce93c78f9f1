package uidrange_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/sandboxowner/owner/provider/local/uidrange"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]string{
		"1-1":          "1-1",
		" 10 - 20 ":    "10-20",
		"5-5":          "5-5",
		"1-4294967294": "1-4294967294",
		"0-5":          "refused", // uid 0 is root
		"5-4":          "refused",
		"1-4294967295": "refused", // (uid_t)-1 is no id
		"10":           "refused",
		"a-5":          "refused",
		"5-b":          "refused",
		"":             "refused",
	} {
		got := "refused"
		if r, err := uidrange.Parse(in); err == nil {
			first, last := r.Bounds()
			got = fmt.Sprintf("%d-%d", first, last)
		}
		if got != want {
			t.Errorf("Parse(%q) = %s, want %s", in, got, want)
		}
	}
}

// The host of testdata/host: app's uid and gid 2000, staff's gid 3000,
// app's subordinate uids 100000-165535 and gids 200000-200009.
var host = uidrange.Host{
	Passwd: "testdata/host/passwd", Group: "testdata/host/group",
	Subuid: "testdata/host/subuid", Subgid: "testdata/host/subgid",
}

// A range is refused when it holds an id the host gives out, up to its
// first and last id exactly, and accepted beside one.
func TestCheckHost(t *testing.T) {
	for _, tc := range []struct {
		rng      string
		storage  [2]int
		h        uidrange.Host
		accepted bool
	}{
		{"1000-1999", [2]int{999, 999}, host, true},
		{"1000-1999", [2]int{1000, 999}, host, false}, // the storage uid, at First
		{"1000-1999", [2]int{999, 1999}, host, false}, // the storage gid, at Last
		{"1000-1999", [2]int{2000, 2000}, host, true},
		{"1000-2000", [2]int{1, 1}, host, false}, // app's uid at Last
		{"2000-2100", [2]int{1, 1}, host, false}, // ... at First
		{"2001-2999", [2]int{1, 1}, host, true},
		{"2001-3000", [2]int{1, 1}, host, false}, // staff's gid
		{"3001-99999", [2]int{1, 1}, host, true},
		{"3001-100000", [2]int{1, 1}, host, false},   // app's first subordinate uid
		{"165535-170000", [2]int{1, 1}, host, false}, // its last
		{"165536-199999", [2]int{1, 1}, host, true},
		{"165536-200000", [2]int{1, 1}, host, false}, // a subordinate gid
		{"200009-300000", [2]int{1, 1}, host, false},
		{"200010-300000", [2]int{1, 1}, host, true},
		// No files (or missing ones) give out no ids.
		{"1-5000000", [2]int{0, 0}, uidrange.Host{}, true},
		{"1-5000000", [2]int{0, 0}, uidrange.Host{Passwd: "testdata/none", Subuid: "testdata/none"}, true},
	} {
		r, err := uidrange.Parse(tc.rng)
		if err != nil {
			t.Fatal(err)
		}
		err = r.CheckHost(tc.h, tc.storage[0], tc.storage[1])
		if tc.accepted && err != nil {
			t.Errorf("%s (storage %v): %v, want it accepted", tc.rng, tc.storage, err)
		}
		if !tc.accepted && !errors.Is(err, uidrange.ErrTaken) {
			t.Errorf("%s (storage %v): %v, want ErrTaken", tc.rng, tc.storage, err)
		}
	}
}

// The refusal names what the host gives out, as an operator reads it at
// startup.
func TestCheckHostSays(t *testing.T) {
	r, _ := uidrange.Parse("150000-150001")
	err := r.CheckHost(host, 1, 1)
	if want := "uid_range 150000-150001 holds ids the host gives out: testdata/host/subuid gives app 100000-165535"; err == nil || err.Error() != want {
		t.Errorf("CheckHost = %v, want %q", err, want)
	}
}

// A file that cannot be read is an error of its own, not a taken range.
func TestCheckHostUnreadable(t *testing.T) {
	r, _ := uidrange.Parse("1-2")
	for _, h := range []uidrange.Host{{Passwd: "testdata"}, {Subgid: "testdata"}} {
		if err := r.CheckHost(h, 0, 0); err == nil || errors.Is(err, uidrange.ErrTaken) {
			t.Errorf("%+v: %v, want a read error", h, err)
		}
	}
}

// Every uid of the range is handed out once, then none; a released uid is
// handed out again; a release by another sandbox than its holder, or of a
// uid held from disk, frees nothing.
func TestTakeAndRelease(t *testing.T) {
	r, _ := uidrange.Parse("10-14")
	got := map[int]string{}
	for i := 0; i < 5; i++ {
		id := fmt.Sprint("sb", i)
		uid, err := r.Take(id)
		if err != nil {
			t.Fatal(err)
		}
		if uid < 10 || uid > 14 || got[uid] != "" {
			t.Fatalf("Take(%s) = %d: outside 10-14 or taken by %s", id, uid, got[uid])
		}
		got[uid] = id
	}
	if _, err := r.Take("sb5"); !errors.Is(err, uidrange.ErrExhausted) {
		t.Fatalf("a sixth Take = %v, want ErrExhausted", err)
	}
	r.Release(12, "someone else")
	if _, err := r.Take("sb5"); !errors.Is(err, uidrange.ErrExhausted) {
		t.Errorf("Take after a release by another sandbox = %v, want ErrExhausted", err)
	}
	r.Release(12, got[12])
	if uid, err := r.Take("sb6"); err != nil || uid != 12 {
		t.Errorf("Take after its holder released 12 = %d, %v; want 12", uid, err)
	}

	held, _ := uidrange.Parse("7-8")
	held.Hold(7, "on disk")
	held.Hold(8, "on disk too")
	if _, err := held.Take("new"); !errors.Is(err, uidrange.ErrExhausted) {
		t.Errorf("Take from a range held from disk = %v, want ErrExhausted", err)
	}
}

// A sandbox's first uid depends on its id alone: the same in two ranges
// alike, and ids spread over a range rather than filling it from one end.
func TestTakeSpreads(t *testing.T) {
	a, _ := uidrange.Parse("1000-1999")
	b, _ := uidrange.Parse("1000-1999")
	var firsts []int
	for i := 0; i < 20; i++ {
		id := fmt.Sprint("session-", i)
		ua, _ := a.Take(id)
		ub, _ := b.Take(id)
		if ua != ub {
			t.Errorf("Take(%s) = %d and %d in two fresh ranges", id, ua, ub)
		}
		firsts = append(firsts, ua)
	}
	low := 0
	for _, u := range firsts {
		if u < 1100 {
			low++
		}
	}
	// 20 ids hashed over 1000 uids: all in the lowest tenth is 1e-20 likely.
	if low == len(firsts) {
		t.Errorf("uids %v: every one in the lowest tenth", firsts)
	}
	one, _ := uidrange.Parse("5-5")
	if uid, err := one.Take("x"); err != nil || uid != 5 {
		t.Errorf("a range of one: %d, %v", uid, err)
	}
}
