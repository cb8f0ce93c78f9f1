package opensandbox

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/provider"
)

func TestParseStream(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stream  string
		cap     int
		timeout time.Duration
		want    provider.ExecResult
		wantErr string
	}{
		{name: "raw frames, exit 0",
			stream: `{"type":"init","text":"cmd-1","timestamp":1}` + "\n\n" + `{"type":"ping","text":"pong"}` + "\n\n" +
				`{"type":"stdout","text":"a\n"}` + "\n\n" + `{"type":"stderr","text":"e"}` + "\n\n" + `{"type":"stdout","text":"b"}` + "\n\n" +
				`{"type":"execution_complete","execution_time":3}` + "\n\n",
			want: provider.ExecResult{Stdout: "a\nb", Stderr: "e"}},
		{name: "SSE data: prefix, comments and event lines",
			stream: ": keepalive\n\nevent: message\ndata: {\"type\":\"stdout\",\"text\":\"x\"}\n\ndata:{\"type\":\"error\",\"error\":{\"ename\":\"CommandExecError\",\"evalue\":\"2\"}}\n\n",
			want:   provider.ExecResult{Stdout: "x", ExitCode: 2}},
		{name: "an unknown event type is skipped",
			stream: `{"type":"result","results":{"text/plain":"4"}}` + "\n\n" + `{"type":"execution_count","execution_count":1}` + "\n\n" + `{"type":"execution_complete"}` + "\n\n",
			want:   provider.ExecResult{}},
		{name: "timeout",
			stream:  `{"type":"error","error":{"ename":"CommandExecError","evalue":"-1"}}` + "\n\n",
			timeout: time.Second,
			want:    provider.ExecResult{ExitCode: 137, TimedOut: true}},
		{name: "output over the cap is cut",
			stream: `{"type":"stdout","text":"0123456789"}` + "\n\n" + `{"type":"execution_complete"}` + "\n\n",
			cap:    4,
			want:   provider.ExecResult{Stdout: "0123", Truncated: true}},
		{name: "could not start",
			stream:  `{"type":"error","error":{"ename":"StartError","evalue":"no such shell"}}` + "\n\n",
			wantErr: "could not run"},
		{name: "stream cut before the end",
			stream:  `{"type":"init","text":"c"}` + "\n\n" + `{"type":"stdout","text":"partial"}`,
			wantErr: errNoFinalEvent.Error()},
		{name: "a frame that is not JSON",
			stream:  `{"type":` + "\n\n",
			wantErr: "bad frame"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := tc.cap
			if cp == 0 {
				cp = 1 << 20
			}
			got, err := parseStream(strings.NewReader(tc.stream), cp, tc.timeout)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseStreamLongFrame(t *testing.T) {
	big := strings.Repeat("x", 3<<20) // longer than bufio's buffer
	got, err := parseStream(strings.NewReader(`{"type":"stdout","text":"`+big+`"}`+"\n\n"+`{"type":"execution_complete"}`+"\n\n"), 4<<20, 0)
	if err != nil || got.Stdout != big {
		t.Fatalf("len %d, %v", len(got.Stdout), err)
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
	for _, bad := range []map[string]string{
		{"bad key": "v"},
		{"opensandbox.io/x": "v"},
		{"UPPER.example/x": "v"},
		{"k": strings.Repeat("v", 70)},
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
