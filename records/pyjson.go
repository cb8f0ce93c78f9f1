package records

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Gym writes records with Python's json.dumps defaults and manifests with
// sort_keys and indent 1; the same records and manifest written here are the
// same bytes, so a records file's name (its digest) does not depend on which
// side wrote it.

// marshalPython is v as Python's json.dumps(v) writes it: ", " and ": "
// between items, every non-ASCII character escaped, no HTML escaping. Map
// keys come sorted (encoding/json), struct fields in their order.
func marshalPython(v any) ([]byte, error) {
	compact, err := marshalPlain(v)
	if err != nil {
		return nil, err
	}
	return pythonize(compact, true), nil
}

// marshalPythonIndent1 is v as json.dumps(v, sort_keys=True, indent=1)
// writes it (v's maps have their keys sorted by encoding/json).
func marshalPythonIndent1(v any) ([]byte, error) {
	compact, err := marshalPlain(v)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, pythonize(compact, false), "", " "); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// marshalPlain is encoding/json's compact form without HTML escaping.
func marshalPlain(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}), nil
}

// pythonize rewrites compact JSON: every non-ASCII character in a string
// becomes \uXXXX (a surrogate pair above U+FFFF), a number with a fraction
// or an exponent is written as Python writes a float, and with spaced a
// space follows each ',' and ':' between tokens.
func pythonize(compact []byte, spaced bool) []byte {
	out := make([]byte, 0, len(compact)+len(compact)/8)
	inString, escaped := false, false
	for i := 0; i < len(compact); {
		c := compact[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRune(compact[i:])
			if r >= 0x10000 {
				r -= 0x10000
				out = fmt.Appendf(out, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
			} else {
				out = fmt.Appendf(out, `\u%04x`, r)
			}
			i += size
			continue
		}
		if !inString && (c == '-' || (c >= '0' && c <= '9')) {
			end := i + 1
			for end < len(compact) && strings.IndexByte("+-.0123456789eE", compact[end]) >= 0 {
				end++
			}
			out = appendPythonNumber(out, compact[i:end])
			i = end
			continue
		}
		out = append(out, c)
		i++
		switch {
		case escaped:
			escaped = false
		case inString && c == '\\':
			escaped = true
		case c == '"':
			inString = !inString
		case !inString && spaced && (c == ',' || c == ':'):
			out = append(out, ' ')
		}
	}
	return out
}

// appendPythonNumber appends a JSON number token as Python's json.dumps
// writes what json.loads made of it: an integer as it is; a float as
// repr() writes it (shortest digits; fixed notation with at least one
// decimal when its exponent is in [-4, 16), else d.ddde±XX).
func appendPythonNumber(out, tok []byte) []byte {
	if !bytes.ContainsAny(tok, ".eE") {
		return append(out, tok...)
	}
	f, err := strconv.ParseFloat(string(tok), 64)
	if err != nil {
		return append(out, tok...)
	}
	sci := strconv.FormatFloat(f, 'e', -1, 64)
	exp, _ := strconv.Atoi(sci[strings.IndexByte(sci, 'e')+1:])
	if exp < -4 || exp >= 16 {
		return append(out, sci...)
	}
	fixed := strconv.AppendFloat(out, f, 'f', -1, 64)
	if bytes.IndexByte(fixed[len(out):], '.') < 0 {
		fixed = append(fixed, ".0"...)
	}
	return fixed
}
