package opensandbox

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/provider"
)

// streamCase is one case of testdata/streams.json: a command stream (frames
// joined as execd joins them, or raw bytes) and what the client makes of it.
type streamCase struct {
	Name           string              `json:"name"`
	Frames         []string            `json:"frames"`
	Raw            string              `json:"raw"`
	Cap            int                 `json:"cap"`
	DeadlinePassed bool                `json:"deadline_passed"`
	Want           provider.ExecResult `json:"want"`
	WantErr        string              `json:"want_err"`
	WantInit       string              `json:"want_init"`
}

func TestParseStream(t *testing.T) {
	b, err := os.ReadFile("testdata/streams.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []streamCase
	if err := json.Unmarshal(b, &cases); err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			stream := tc.Raw
			for _, f := range tc.Frames {
				stream += f + "\n\n"
			}
			cp := tc.Cap
			if cp == 0 {
				cp = 1 << 20
			}
			var init string
			got, err := parseStream(strings.NewReader(stream), cp, streamHooks{
				init:     func(id string) { init = id },
				timedOut: func() bool { return tc.DeadlinePassed },
			})
			if init != tc.WantInit {
				t.Errorf("init %q, want %q", init, tc.WantInit)
			}
			if tc.WantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.WantErr) {
					t.Fatalf("err %v, want %q", err, tc.WantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.Want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseStreamLongFrame(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 256<<10) // longer than the reader's 64 KiB buffer
	got, err := parseStream(strings.NewReader(`{"type":"stdout","text":"`+big+`"}`+"\n\n"+`{"type":"execution_complete"}`+"\n\n"), 4<<20, streamHooks{})
	if err != nil || got.Stdout != big+"\n" || got.Truncated {
		t.Fatalf("len %d, truncated %v, %v", len(got.Stdout), got.Truncated, err)
	}
}

// A frame exactly as long as a frame may be is whole: its output is not
// reported cut.
func TestParseStreamFrameAtTheBound(t *testing.T) {
	frame := `{"type":"stdout","text":"hello"}`
	stream := frame + "\n\n" + `{"type":"execution_complete"}` + "\n\n"
	got, err := parseFrames(strings.NewReader(stream), 1<<10, len(frame), streamHooks{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(provider.ExecResult{Stdout: "hello\n"}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// A line longer than a frame may be is cut, not an error that loses the
// output around it; the cut may fall inside a JSON escape.
func TestParseStreamLineOverFrame(t *testing.T) {
	t.Parallel()
	// A frame of 256 KiB (the client's is 16 MiB) still spans several
	// reads of the 64 KiB buffer.
	const frame = 256 << 10
	for _, tail := range []string{"x", `\u00e9`, `\n`} {
		line := strings.Repeat("y", frame-len(`{"type":"stderr","text":"`)-1) + strings.Repeat(tail, 8)
		stream := `{"type":"stdout","text":"before"}` + "\n\n" + `{"type":"stderr","text":"` + line + `"}` + "\n\n" +
			`{"type":"stdout","text":"after"}` + "\n\n" + `{"type":"execution_complete"}` + "\n\n"
		got, err := parseFrames(strings.NewReader(stream), 64, frame, streamHooks{})
		if err != nil {
			t.Fatalf("tail %q: %v", tail, err)
		}
		want := provider.ExecResult{Stdout: "before\nafter\n", Stderr: strings.Repeat("y", 64), Truncated: true}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("tail %q (-want +got):\n%s", tail, diff)
		}
	}
	// Unit test of the cut itself: the text up to the last whole escape.
	out := &capped{max: 1 << 10}
	c, text, ok := partialLine([]byte(`{"type":"stdout","text":"ab\u00e9\u00`), out, nil)
	if !ok || c != out || text != "abé" {
		t.Errorf("partialLine = %v %q %v", c == out, text, ok)
	}
	// Of a long frame only what fits is decoded; the text is a whole
	// prefix of the line's, at least as long as the room, wherever the
	// shortened frame's end falls in an escape.
	for room := 10; room < 16; room++ {
		small := &capped{max: room}
		_, text, ok := partialLine([]byte(`{"type":"stdout","text":"x`+strings.Repeat(`\u00e9`, 1000)), small, nil)
		full := "x" + strings.Repeat("é", 1000)
		if !ok || len(text) < room || len(text) > 200 || !strings.HasPrefix(full, text) {
			t.Errorf("room %d: partialLine = %q (%d bytes), %v; want a prefix of the line of at least %d bytes, far short of all of it", room, text, len(text), ok, room)
		}
	}
	if _, _, ok := partialLine([]byte(`{"type":"ping","text":"`), out, nil); ok {
		t.Error("a cut frame that is not output was taken for output")
	}
}

// A workdir execd would expand is refused when it is configured and when a
// spec names it, before anything is created.
func TestWorkdirIsLiteral(t *testing.T) {
	if _, err := New(Options{Domain: "127.0.0.1:1", Workdir: "/w/$HOME"}); !errors.Is(err, provider.ErrInvalidSpec) {
		t.Errorf("New with workdir /w/$HOME: %v, want ErrInvalidSpec", err)
	}
	p, err := New(Options{Domain: "127.0.0.1:1"}) // nothing listens: any call would fail otherwise
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Start(context.Background(), provider.Spec{Image: "i", Workdir: "/w/${X}"}); !errors.Is(err, provider.ErrInvalidSpec) {
		t.Errorf("Start with workdir /w/${X}: %v, want ErrInvalidSpec", err)
	}
}

func TestLiteral(t *testing.T) {
	for name, expands := range map[string]bool{
		"/w/cost$HOME.txt": true, "/w/${X}": true, "/w/$1": true, "/w/$$": true, "/w/${}": true,
		"/w/price$": false, "/w/a$.txt": false, "/w/$ x": false, "/w/plain": false, "/w/~x": false,
	} {
		err := literal("path", name)
		if got := err != nil; got != expands {
			t.Errorf("literal(%q) = %v, want refused %v", name, err, expands)
		}
		if err != nil && !errors.Is(err, provider.ErrInvalidSpec) {
			t.Errorf("literal(%q) = %v, not ErrInvalidSpec", name, err)
		}
	}
}
func TestLabels(t *testing.T) {
	in := map[string]string{
		"ng.owner":          "notes",
		"ng.restore":        "ckpt:1/a b",
		"ng.session":        strings.Repeat("s", 30),
		"sandboxowner.io/x": "b32.looks-encoded",
		"empty":             "",
	}
	enc, err := encodeLabels(in)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range enc {
		if len(v) > 63 || !labelValue.MatchString(v) {
			t.Errorf("%s=%q is not a label value", k, v)
		}
	}
	if enc["ng.owner"] != "notes" {
		t.Errorf("a valid value was encoded: %q", enc["ng.owner"])
	}
	if diff := cmp.Diff(in, decodeLabels(enc)); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	// At Kubernetes' limits: a key's prefix of 253 bytes and name of 63,
	// a value of 63 kept as it is (one of 64 is too long even encoded).
	a62 := strings.Repeat("a", 62)
	prefix253 := strings.Join([]string{a62, a62, a62, a62}, ".") + ".b"
	atLimits := map[string]string{prefix253 + "/x": "v", strings.Repeat("n", 63): "v", "k": strings.Repeat("v", 63)}
	enc, err = encodeLabels(atLimits)
	if err != nil {
		t.Fatalf("labels at the limits: %v", err)
	}
	if diff := cmp.Diff(atLimits, enc); diff != "" {
		t.Errorf("labels at the limits, encoded (-want +got):\n%s", diff)
	}
	for _, bad := range []map[string]string{
		{"bad key": "v"},
		{"opensandbox.io/x": "v"},
		{"UPPER.example/x": "v"},
		{"k": strings.Repeat("v", 70)},
		{"k": strings.Repeat("v", 64)},
		{prefix253 + "c/x": "v"},
		{strings.Repeat("n", 64): "v"},
	} {
		if _, err := encodeLabels(bad); !errors.Is(err, provider.ErrInvalidSpec) {
			t.Errorf("encodeLabels(%v) = %v, want ErrInvalidSpec", bad, err)
		}
	}
	name := encodeSnapshotName("ck 1", "tok", map[string]string{"ng.owner": "a&b"})
	n, tok, md, ok := decodeSnapshotName(name)
	if !ok || n != "ck 1" || tok != "tok" || md["ng.owner"] != "a&b" {
		t.Errorf("snapshot name round trip: %q %q %v %v", n, tok, md, ok)
	}
	if _, _, _, ok := decodeSnapshotName("someone-elses"); ok {
		t.Error("a foreign snapshot name decoded")
	}
}
