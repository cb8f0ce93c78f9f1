// Package jsonw appends JSON to a byte slice without reflection, byte for
// byte as encoding/json's Marshal writes it, for the replies on a request's
// hot path. A value of a type it does not know is handed to json.Marshal.
package jsonw

import (
	"encoding/json"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"
)

const hex = "0123456789abcdef"

// AppendString appends s as a JSON string, escaped as json.Marshal escapes
// it (HTML characters, U+2028 and U+2029 included; invalid UTF-8 as
// U+FFFD).
func AppendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// AppendTime appends t as time.Time's MarshalJSON does (RFC 3339 with
// nanoseconds, quoted).
func AppendTime(dst []byte, t time.Time) ([]byte, error) {
	if y := t.Year(); y < 0 || y > 9999 {
		return appendMarshal(dst, t)
	}
	dst = append(dst, '"')
	dst = t.AppendFormat(dst, time.RFC3339Nano)
	return append(dst, '"'), nil
}

// maxSorted is how many keys a map may have for them to be sorted on the
// stack.
const maxSorted = 16

// Append appends v as json.Marshal would: strings, booleans, nil, ints,
// times, and maps of them with string keys (sorted, as Marshal sorts them)
// without reflection; anything else through json.Marshal.
func Append(dst []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(dst, "null"...), nil
	case string:
		return AppendString(dst, v), nil
	case bool:
		return strconv.AppendBool(dst, v), nil
	case int:
		return strconv.AppendInt(dst, int64(v), 10), nil
	case int64:
		return strconv.AppendInt(dst, v, 10), nil
	case time.Time:
		return AppendTime(dst, v)
	case map[string]string:
		if v == nil {
			return append(dst, "null"...), nil
		}
		return appendMap(dst, v, func(dst []byte, s string) ([]byte, error) { return AppendString(dst, s), nil })
	case map[string]any:
		if v == nil {
			return append(dst, "null"...), nil
		}
		return appendMap(dst, v, Append)
	case json.RawMessage:
		if plainRaw(v) {
			return append(dst, v...), nil
		}
	}
	return appendMarshal(dst, v)
}

// plainRaw reports whether json.Marshal writes raw as it is: valid JSON
// with nothing Marshal's compaction drops (whitespace) or escapes (the
// HTML characters, U+2028 and U+2029, whose encodings begin with 0xE2).
// A session's setup data, a seed's reply, is such an object.
func plainRaw(raw json.RawMessage) bool {
	if len(raw) == 0 {
		return false // Marshal writes null
	}
	for _, b := range raw {
		switch b {
		case ' ', '\t', '\n', '\r', '<', '>', '&', 0xE2:
			return false
		}
	}
	return json.Valid(raw)
}

func appendMap[V any](dst []byte, m map[string]V, value func([]byte, V) ([]byte, error)) ([]byte, error) {
	if len(m) > maxSorted {
		return appendMarshal(dst, m)
	}
	var arr [maxSorted]string
	keys := arr[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	dst = append(dst, '{')
	var err error
	for i, k := range keys {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = AppendString(dst, k)
		dst = append(dst, ':')
		if dst, err = value(dst, m[k]); err != nil {
			return dst, err
		}
	}
	return append(dst, '}'), nil
}

func appendMarshal(dst []byte, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return dst, err
	}
	return append(dst, b...), nil
}
