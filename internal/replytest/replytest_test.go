package replytest_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/internal/replytest"
)

func TestEncode(t *testing.T) {
	for _, tc := range []struct {
		in   any
		want string
	}{
		{nil, ""},
		{`{"raw":`, `{"raw":`},
		{[]byte("bytes"), "bytes"},
		{map[string]int{"a": 1}, `{"a":1}`},
	} {
		got, err := replytest.Encode(tc.in)
		if err != nil || string(got) != tc.want {
			t.Errorf("Encode(%v) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := replytest.Encode(func() {}); err == nil {
		t.Error("Encode of a func: no error")
	}
}

func TestObjectAndCode(t *testing.T) {
	body := []byte(`{"error":{"code":"not_found","detail":"x"}}`)
	want := map[string]any{"error": map[string]any{"code": "not_found", "detail": "x"}}
	if diff := cmp.Diff(want, replytest.Object(t, 404, body)); diff != "" {
		t.Errorf("Object (-want +got):\n%s", diff)
	}
	if got := replytest.Code(body); got != "not_found" {
		t.Errorf("Code = %q, want not_found", got)
	}
	if got := replytest.Code([]byte(`{"ok":true}`)); got != "" {
		t.Errorf("Code of a reply without an envelope = %q, want none", got)
	}
}
