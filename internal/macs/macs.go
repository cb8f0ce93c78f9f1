// Package macs computes HMAC-SHA256s under one key with keyed states kept
// for reuse: keying a state hashes the key's two pads, which costs as much
// as a short message's MAC, and a request signs or checks one or two.
package macs

import (
	"crypto/hmac"
	"crypto/sha256"
	"hash"
	"sync"
)

// Size is the length of a MAC.
const Size = sha256.Size

// Keyed computes MACs under one key; it is safe for concurrent use.
type Keyed struct {
	pool sync.Pool
}

// state is one keyed HMAC with the buffers its MAC is computed in.
type state struct {
	h   hash.Hash
	in  []byte
	sum [Size]byte
}

// New returns MACs keyed with key (copied).
func New(key []byte) *Keyed {
	key = append([]byte(nil), key...)
	k := &Keyed{}
	k.pool.New = func() any { return &state{h: hmac.New(sha256.New, key)} }
	return k
}

// mac computes the MAC of the concatenated parts and tail in a state,
// which the caller puts back.
func (k *Keyed) mac(parts []string, tail []byte) *state {
	st := k.pool.Get().(*state)
	st.in = st.in[:0]
	for _, p := range parts {
		st.in = append(st.in, p...)
	}
	st.in = append(st.in, tail...)
	st.h.Reset()
	st.h.Write(st.in)
	st.h.Sum(st.sum[:0])
	return st
}

// Append appends the MAC of the concatenated parts to dst.
func (k *Keyed) Append(dst []byte, parts ...string) []byte {
	st := k.mac(parts, nil)
	dst = append(dst, st.sum[:]...)
	k.pool.Put(st)
	return dst
}

// Equal reports, in constant time, whether mac is the MAC of the
// concatenated parts.
func (k *Keyed) Equal(mac []byte, parts ...string) bool {
	st := k.mac(parts, nil)
	ok := hmac.Equal(mac, st.sum[:])
	k.pool.Put(st)
	return ok
}

// AppendTo appends the MAC of prefix followed by msg to dst: Append for a
// message still in a byte slice.
func (k *Keyed) AppendTo(dst []byte, prefix string, msg []byte) []byte {
	st := k.mac([]string{prefix}, msg)
	dst = append(dst, st.sum[:]...)
	k.pool.Put(st)
	return dst
}
