package swebench

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/sandboxowner/owner/clock"
)

func TestTrackerShowsEachInstancesOldestWait(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	log, hook := logtest.NewNullLogger()
	tr := newTracker(clk, 10*time.Second, log)
	a1 := tr.start(Row{InstanceID: "a", Repo: "o/a"}, PhaseTemplate, log.WithField("instance_id", "a"))
	clk.Advance(3 * time.Second)
	a1.phase(PhaseEnvironment)
	clk.Advance(2 * time.Second)
	a2 := tr.start(Row{InstanceID: "a", Repo: "o/a"}, PhaseTemplate, log)
	b := tr.start(Row{InstanceID: "b", Repo: "o/b"}, PhaseTemplate, log)
	clk.Advance(time.Second)
	b.phase(PhaseValidation)
	want := []Preparing{
		{InstanceID: "a", Repo: "o/a", Phase: PhaseEnvironment, ElapsedSeconds: 6, PhaseSeconds: 3, Waiting: 2},
		{InstanceID: "b", Repo: "o/b", Phase: PhaseValidation, ElapsedSeconds: 1, PhaseSeconds: 0, Waiting: 1},
	}
	if d := cmp.Diff(want, tr.snapshot()); d != "" {
		t.Errorf("snapshot (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string]int{PhaseTemplate: 0, PhaseEnvironment: 1, PhaseValidation: 1}, tr.byPhase()); d != "" {
		t.Errorf("byPhase (-want +got):\n%s", d)
	}
	// Ten seconds after it began, a1 logs its phase; the others have
	// not waited that long.
	if len(hook.AllEntries()) != 0 {
		t.Fatalf("logged before the interval: %v", hook.AllEntries())
	}
	clk.Advance(4 * time.Second)
	entries := hook.AllEntries()
	if len(entries) != 1 || entries[0].Data["instance_id"] != "a" || entries[0].Data["phase"] != PhaseEnvironment ||
		entries[0].Data["elapsed_s"] != 10.0 || entries[0].Data["phase_elapsed_s"] != 7.0 || entries[0].Level != logrus.InfoLevel {
		t.Fatalf("the first progress line: %+v", entries)
	}
	// Done, a request's lines stop and its wait leaves the snapshot; the
	// instance's other request keeps it there.
	a1.done()
	a1.done()
	hook.Reset()
	for range 3 {
		clk.Advance(10 * time.Second)
	}
	for _, e := range hook.AllEntries() {
		if e.Data["instance_id"] == "a" && e.Data["phase_elapsed_s"] != nil && e.Data["elapsed_s"].(float64) > 30 {
			t.Errorf("a finished request still logs: %+v", e.Data)
		}
	}
	if n := len(hook.AllEntries()); n != 6 {
		t.Errorf("%d progress lines in 30 s of two requests logging every 10 s, want 6", n)
	}
	got := tr.snapshot()
	if len(got) != 2 || got[0].Waiting != 1 || got[0].Phase != PhaseTemplate || got[0].ElapsedSeconds != 35 {
		t.Errorf("after a1's end: %+v", got)
	}
	a2.done()
	b.done()
	if got := tr.snapshot(); len(got) != 0 {
		t.Errorf("after every end: %+v", got)
	}
	if n := clk.Pending(); n != 0 {
		t.Errorf("%d timers left", n)
	}
	var nilPrep *prep
	nilPrep.phase(PhaseValidation)
	nilPrep.done()
}

func TestProgressBar(t *testing.T) {
	for _, c := range []struct {
		n, total, width int
		want            string
	}{
		{0, 4, 8, "[>       ] 0/4"},
		{1, 4, 8, "[==>     ] 1/4"},
		{4, 4, 8, "[========] 4/4"},
		{9, 4, 8, "[========] 4/4"},
		{3, 0, 8, "3/0"},
	} {
		if got := ProgressBar(c.n, c.total, c.width); got != c.want {
			t.Errorf("ProgressBar(%d, %d, %d) = %q, want %q", c.n, c.total, c.width, got, c.want)
		}
	}
}

func TestPrepareReports(t *testing.T) {
	ok := &Environment{OK: true}
	cases := []struct {
		r    readiness
		err  error
		want PrepareReport
	}{
		{readiness{env: ok, validation: &Validation{Available: true}}, nil, PrepareReport{InstanceID: "i", Environment: "ok", Validation: "available", Seconds: 1.5}},
		{readiness{env: ok, validation: &Validation{Reason: "2 PASS_TO_PASS tests do not pass: TestA, TestB"}}, nil,
			PrepareReport{InstanceID: "i", Environment: "ok", Validation: "unavailable", Seconds: 1.5, Reason: "2 PASS_TO_PASS tests do not pass: TestA, TestB"}},
		{readiness{env: &Environment{Reason: "exited 3"}}, nil, PrepareReport{InstanceID: "i", Environment: "failed", Validation: "-", Seconds: 1.5, Reason: "exited 3"}},
		{readiness{}, nil, PrepareReport{InstanceID: "i", Environment: "image", Validation: "off", Seconds: 1.5}},
		{readiness{}, ErrUnknownRepo, PrepareReport{InstanceID: "i", Environment: "error", Validation: "-", Seconds: 1.5, Reason: ErrUnknownRepo.Error()}},
	}
	for _, c := range cases {
		got := reportOf("i", c.r, c.err, 1500*time.Millisecond)
		if d := cmp.Diff(c.want, got); d != "" {
			t.Errorf("(-want +got):\n%s", d)
		}
		if ready := got.Environment != "error" && got.Environment != "failed" && got.Validation != "unavailable"; ready != got.Ready() {
			t.Errorf("%+v: Ready %v", got, got.Ready())
		}
	}
	table := FormatPrepareTable([]PrepareReport{
		{InstanceID: "gin-gonic__gin-1", Environment: "ok", Validation: "available", Seconds: 12.25},
		{InstanceID: "x", Environment: "failed", Validation: "-", Seconds: 3, Reason: "the environment step exited 1:\n  go: no\tnetwork"},
	})
	want := "INSTANCE          ENVIRONMENT  VALIDATION  SECONDS  REASON\n" +
		"gin-gonic__gin-1  ok           available   12.2     \n" +
		"x                 failed       -           3.0      the environment step exited 1: go: no network\n"
	if table != want {
		t.Errorf("table:\n%s\nwant:\n%s", table, want)
	}
	if got := oneLine(strings.Repeat("é", 100), 11); got != "ééééé…" {
		t.Errorf("oneLine cut to %q", got)
	}
}
