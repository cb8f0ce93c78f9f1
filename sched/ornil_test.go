package sched_test

import (
	"testing"

	"github.com/sandboxowner/owner/sched"
)

// TestOrNil: a nil *Det passed on as a Runtime is a nil interface, so that
// code choosing between its own default and a Runtime (sched.Or, the
// fake's "nil: wall-clock latency") sees no runtime rather than a nil Det.
func TestOrNil(t *testing.T) {
	var none *sched.Det
	if rt := none.OrNil(); rt != nil {
		t.Fatalf("OrNil of a nil *Det = %#v, want a nil Runtime", rt)
	}
	if _, isReal := sched.Or(none.OrNil()).(sched.Real); !isReal {
		t.Fatal("Or of a nil *Det's OrNil is not the real runtime")
	}
	d := sched.NewDet(1, t0)
	defer d.Close()
	if rt := d.OrNil(); rt != sched.Runtime(d) {
		t.Fatalf("OrNil of a Det = %#v, want the Det", rt)
	}
}
