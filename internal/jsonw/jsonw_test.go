package jsonw

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// same checks that Append writes what json.Marshal writes for v, error
// or not.
func same(t *testing.T, v any) {
	t.Helper()
	want, werr := json.Marshal(v)
	got, gerr := Append([]byte("prefix:"), v)
	if (werr != nil) != (gerr != nil) {
		t.Fatalf("%#v: error %v, json.Marshal's %v", v, gerr, werr)
	}
	if werr != nil {
		return
	}
	if diff := cmp.Diff("prefix:"+string(want), string(got)); diff != "" {
		t.Fatalf("%#v (-json.Marshal +Append):\n%s", v, diff)
	}
}

func TestStringsAsMarshalWritesThem(t *testing.T) {
	for _, s := range []string{
		"", "plain", `quote " backslash \ slash /`, "<script>&amp;</script>", "\b\f\n\r\t\x00\x01\x1f\x7f",
		"é ü ☃ 😀", "line\u2028sep\u2029", "bad \xff utf8 \xc3", "\xe2\x80", "trailing \xf0\x9f\x98",
	} {
		same(t, s)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 5000 {
		b := make([]byte, rng.IntN(24))
		for i := range b {
			// Mostly the interesting bytes: controls, the escaped ASCII,
			// lead and continuation bytes.
			b[i] = []byte{0, 0x1f, ' ', '"', '\\', '<', '>', '&', 'a', 0x7f, 0x80, 0xbf, 0xc3, 0xe2, 0xf0, 0xff}[rng.IntN(16)]
			if rng.IntN(4) == 0 {
				b[i] = byte(rng.IntN(256))
			}
		}
		same(t, string(b))
	}
}

func TestValuesAsMarshalWritesThem(t *testing.T) {
	big := map[string]any{}
	for i := range maxSorted + 1 {
		big[fmt.Sprintf("k%02d", i)] = i
	}
	for _, v := range []any{
		nil, true, false, 0, -42, int64(1) << 60,
		time.Date(2026, 12, 4, 18, 0, 0, 0, time.UTC),
		time.Date(2026, 12, 4, 18, 0, 0, 123456789, time.FixedZone("x", 3600)),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), // Marshal's error
		map[string]string(nil), map[string]any(nil), map[string]string{"b": "2", "a": "<1>"},
		map[string]any{"sandbox_id": "sb-1", "workdir": nil, "endpoint": "http://h/sandboxes/sb-1", "token": "v1.x.y",
			"token_expires_at": time.Unix(1_800_000_000, 0).UTC(), "headers": map[string]string{"X-Key": "k"}, "n": 3.5,
			"nested": map[string]any{"z": []int{1}, "a": struct{ A int }{1}}},
		big,
		struct{ A string }{"fallback"},
		json.RawMessage(nil), json.RawMessage(`{"seed_token":"0123abcd"}`), json.RawMessage(`[1,{"a":null}]`),
		json.RawMessage(`{ "a" : 1 }`), json.RawMessage("{\"a\":\"<&>\u2028\"}"), json.RawMessage(`{"a":`),
		json.RawMessage(`"x" "y"`), json.RawMessage(`1`),
		func() {}, // Marshal's error
	} {
		same(t, v)
	}
}

// TestRawAppendsWithoutMarshal: a compact raw message (a seed's reply) is
// appended as it is, without json.Marshal's allocations.
func TestRawAppendsWithoutMarshal(t *testing.T) {
	var raw any = json.RawMessage(`{"seed_token":"00112233445566778899aabbccddeeff"}`)
	buf := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() { _, _ = Append(buf[:0], raw) }); n != 0 {
		t.Fatalf("%v allocations, want 0", n)
	}
}
