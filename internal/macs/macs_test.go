package macs

import (
	"crypto/hmac"
	"crypto/sha256"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func reference(key []byte, msg string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(msg))
	return m.Sum(nil)
}

// A MAC is HMAC-SHA256 of the parts run together, whichever state computes
// it (each state is reset before use), appended after what dst held; Equal
// accepts it and nothing else; the key is copied.
func TestMACs(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	k := New(key)
	key[0] = 'X' // the caller's slice changing changes nothing
	orig := []byte("0123456789abcdef0123456789abcdef")
	for _, parts := range [][]string{{}, {"a"}, {"name", "\x00", "id"}, {"a long part that runs past one block of the hash, sixty-four bytes and more", "!"}} {
		msg := ""
		for _, p := range parts {
			msg += p
		}
		want := reference(orig, msg)
		for range 3 { // states come back from the pool
			got := k.Append([]byte("pre"), parts...)
			if diff := cmp.Diff(append([]byte("pre"), want...), got); diff != "" {
				t.Fatalf("%q (-want +got):\n%s", parts, diff)
			}
			if len(parts) > 0 {
				tail := ""
				for _, p := range parts[1:] {
					tail += p
				}
				if diff := cmp.Diff(want, k.AppendTo(nil, parts[0], []byte(tail))); diff != "" {
					t.Fatalf("%q through AppendTo (-want +got):\n%s", parts, diff)
				}
			}
			if !k.Equal(want, parts...) {
				t.Fatalf("%q: its own MAC is not equal", parts)
			}
			bad := append([]byte(nil), want...)
			bad[Size-1] ^= 1
			if k.Equal(bad, parts...) || k.Equal(want[:Size-1], parts...) {
				t.Fatalf("%q: a changed or short MAC is equal", parts)
			}
		}
	}
}
