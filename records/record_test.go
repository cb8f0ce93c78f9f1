package records

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestPythonize(t *testing.T) {
	for _, tc := range []struct {
		in     any
		spaced string
		indent string
	}{
		{map[string]any{"b": 1, "a": []any{1, "x"}}, `{"a": [1, "x"], "b": 1}`, "{\n \"a\": [\n  1,\n  \"x\"\n ],\n \"b\": 1\n}"},
		{"a,b:c", `"a,b:c"`, `"a,b:c"`},
		{`q"u,o:te\`, `"q\"u,o:te\\"`, `"q\"u,o:te\\"`},
		{"<&>", `"<&>"`, `"<&>"`},
		{"é✓", `"\u00e9\u2713"`, `"\u00e9\u2713"`},
		{"😀", `"\ud83d\ude00"`, `"\ud83d\ude00"`},
		{map[string]any{"é": []any{}}, `{"\u00e9": []}`, "{\n \"\\u00e9\": []\n}"},
		{json.RawMessage(`[2e-7,1.0,1e2,0.00001,0.0001,1.5E+3,1e16,1.5e16,-0.0,12,-3,123456789.125]`),
			`[2e-07, 1.0, 100.0, 1e-05, 0.0001, 1500.0, 1e+16, 1.5e+16, -0.0, 12, -3, 123456789.125]`,
			"[\n 2e-07,\n 1.0,\n 100.0,\n 1e-05,\n 0.0001,\n 1500.0,\n 1e+16,\n 1.5e+16,\n -0.0,\n 12,\n -3,\n 123456789.125\n]"},
		{"1.5e3", `"1.5e3"`, `"1.5e3"`},
	} {
		got, err := marshalPython(tc.in)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tc.spaced {
			t.Errorf("marshalPython(%v) = %s, want %s", tc.in, got, tc.spaced)
		}
		got, err = marshalPythonIndent1(tc.in)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tc.indent {
			t.Errorf("marshalPythonIndent1(%v) = %q, want %q", tc.in, got, tc.indent)
		}
	}
}

func TestEpisodeOf(t *testing.T) {
	for key, want := range map[string]*EpisodeID{
		"":         nil,
		"r1":       {RolloutID: "r1"},
		"r1-a2":    {RolloutID: "r1", Attempt: 2},
		"r-a-a10":  {RolloutID: "r-a", Attempt: 10},
		"r1-b2":    {RolloutID: "r1-b2"},
		"r1-a":     {RolloutID: "r1-a"},
		"run.x-a1": {RolloutID: "run.x", Attempt: 1},
	} {
		got := EpisodeOf(key)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("EpisodeOf(%q) (-want +got):\n%s", key, diff)
		}
		if got.CaptureKey() != key {
			t.Errorf("EpisodeOf(%q).CaptureKey() = %q", key, got.CaptureKey())
		}
	}
}

// A time written as Unix seconds reads back to the microsecond and writes
// the same number again.
func TestSnapshotAtRoundTrip(t *testing.T) {
	for _, at := range []time.Time{
		time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC),
		time.Date(2031, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Unix(0, 1000),
	} {
		s := UnixSeconds(at)
		back := TimeOf(s)
		if !back.Equal(at.Truncate(time.Microsecond)) {
			t.Errorf("%v → %v → %v", at, s, back)
		}
		if UnixSeconds(back) != s {
			t.Errorf("%v: %v written again as %v", at, s, UnixSeconds(back))
		}
	}
}

func TestRecordLineRoundTrip(t *testing.T) {
	for _, r := range sampleRecords() {
		line, err := r.Line()
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseRecord(line)
		if err != nil {
			t.Fatal(err)
		}
		again, err := back.Line()
		if err != nil {
			t.Fatal(err)
		}
		if string(again) != string(line) {
			t.Fatalf("line changed on a round trip:\n%s\n%s", line, again)
		}
	}
}

func TestParseRecordRefuses(t *testing.T) {
	for _, line := range []string{
		`[1]`,
		`{"session_id": "s"}`,
		`{"session_id": "s", "state": {"sandbox": {"provider_name": "local"}}}`,
		`{"session_id": "", "state": {"sandbox": {"provider_name": "local", "snapshot_id": "x"}}}`,
		`{"session_id": "s", "state": {"sandbox": {"snapshot_id": "x"}}}`,
		`{"session_id": 3}`,
	} {
		if _, err := ParseRecord([]byte(line)); !errors.Is(err, ErrInvalidState) {
			t.Errorf("ParseRecord(%s) = %v, want ErrInvalidState", line, err)
		}
	}
}
