// Package jsonr reads the members of a JSON object without reflection or
// allocation, for request bodies on a hot path. It reads valid JSON only
// (the caller checks json.Valid first) and reports ok false for anything it
// would not read exactly as encoding/json does (an escape in a key or a
// string, a key matched only case-insensitively, a repeated field), so that
// the caller decodes that body with encoding/json instead, errors included.
package jsonr

import (
	"bytes"
	"unicode/utf8"
)

// Members calls fn with each member of the object data, in order: its key
// as written between the quotes, and its value without the whitespace
// around it. data must be valid JSON. ok is false when data is not an
// object, a key holds an escape, or fn returns false.
func Members(data []byte, fn func(key, value []byte) bool) (ok bool) {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return false
	}
	i = skipSpace(data, i+1)
	if data[i] == '}' {
		return true
	}
	for {
		// A member: "key" : value, then ',' or '}'.
		end := stringEnd(data, i)
		key := data[i+1 : end-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			return false
		}
		i = skipSpace(data, end)
		i = skipSpace(data, i+1) // past ':'
		vend := valueEnd(data, i)
		if !fn(key, data[i:vend]) {
			return false
		}
		i = skipSpace(data, vend)
		if data[i] == '}' {
			return true
		}
		i = skipSpace(data, i+1) // past ','
	}
}

// String returns the contents of a string value that decodes to its own
// bytes: no escape, valid UTF-8 (encoding/json replaces invalid bytes).
func String(value []byte) ([]byte, bool) {
	if len(value) < 2 || value[0] != '"' {
		return nil, false
	}
	s := value[1 : len(value)-1]
	if bytes.IndexByte(s, '\\') >= 0 || !utf8.Valid(s) {
		return nil, false
	}
	return s, true
}

// Int returns the value of an integer number of at most 18 digits (no
// fraction, no exponent): one that fits an int as encoding/json reads it.
func Int(value []byte) (int, bool) {
	digits := value
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 18 {
		return 0, false
	}
	n := 0
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	if len(digits) < len(value) {
		n = -n
	}
	return n, true
}

// Fields matches a member's key against a struct's field names as
// encoding/json would. i is the index of the name key equals exactly, or -1
// for a key that matches none; ok is false for a key encoding/json would
// match differently: case-insensitively, or by its Unicode folding (a
// non-ASCII key).
func Fields(key []byte, names ...string) (i int, ok bool) {
	for j, n := range names {
		if string(key) == n {
			return j, true
		}
	}
	for _, c := range key {
		if c >= utf8.RuneSelf {
			return -1, false
		}
	}
	for _, n := range names {
		if foldEqual(key, n) {
			return -1, false
		}
	}
	return -1, true
}

// Object reads the members of the object data into a struct whose JSON
// field names are names (at most 64), as encoding/json would: fn gets the
// index of each member's name and its value, and returns false for a value
// it cannot read. A key that matches no name is refused when strict (as
// DisallowUnknownFields does) and skipped otherwise. ok is false, for the
// caller to decode the body with encoding/json instead, when data is not an
// object, a key holds an escape or matches a name only by folding, a name
// repeats, an unknown key comes in strict mode, or fn returns false.
func Object(data []byte, strict bool, names []string, fn func(i int, value []byte) bool) (ok bool) {
	var seen uint64
	return Members(data, func(key, value []byte) bool {
		i, exact := Fields(key, names...)
		switch {
		case !exact:
			return false
		case i < 0:
			return !strict
		case seen&(1<<i) != 0:
			return false
		}
		seen |= 1 << i
		return fn(i, value)
	})
}

// foldEqual reports whether the ASCII key equals name but for case.
func foldEqual(key []byte, name string) bool {
	if len(key) != len(name) {
		return false
	}
	for i, c := range key {
		if lower(c) != lower(name[i]) {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

func skipSpace(data []byte, i int) int {
	for i < len(data) {
		switch data[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// stringEnd returns the index just past the string that starts at i.
func stringEnd(data []byte, i int) int {
	for i++; ; i++ {
		switch data[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
}

// valueEnd returns the index just past the value that starts at i.
func valueEnd(data []byte, i int) int {
	switch data[i] {
	case '"':
		return stringEnd(data, i)
	case '{', '[':
		depth := 0
		for ; ; i++ {
			switch data[i] {
			case '"':
				i = stringEnd(data, i) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
	}
	// A number or a literal runs to the next delimiter, which a member's
	// value in valid JSON always has after it.
	for ; ; i++ {
		switch data[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
	}
}
