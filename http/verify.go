package http

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/sandboxowner/owner/internal/jsonr"
)

// echoRequest makes verify's reply extend its request, as Gym's verify
// responses do: an agent validates the reply as the request's model plus
// reward, so it needs responses_create_params, response and every other
// field of the request back. The grader's fields win over the request's
// fields of the same name; the request's fields keep their order, the
// grader's new ones follow in theirs.
func echoRequest(req []byte, reply any) (json.RawMessage, error) {
	rep, err := json.Marshal(reply)
	if err != nil {
		return nil, fmt.Errorf("encode the verify reply: %w", err)
	}
	reqKeys, reqVals, err := objectFields(req)
	if err != nil {
		return nil, fmt.Errorf("the verify request: %w", err)
	}
	repKeys, repVals, err := objectFields(rep)
	if err != nil {
		return nil, fmt.Errorf("the verify reply is not a JSON object: %w", err)
	}
	graded := make(map[string]json.RawMessage, len(repKeys))
	for i, k := range repKeys {
		graded[k] = repVals[i]
	}
	var b bytes.Buffer
	b.WriteByte('{')
	n := 0
	field := func(k string, v json.RawMessage) {
		if n > 0 {
			b.WriteByte(',')
		}
		n++
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteByte(':')
		b.Write(v)
	}
	asked := make(map[string]bool, len(reqKeys))
	for i, k := range reqKeys {
		asked[k] = true
		if v, ok := graded[k]; ok {
			field(k, v)
			continue
		}
		field(k, reqVals[i])
	}
	for i, k := range repKeys {
		if !asked[k] {
			field(k, repVals[i])
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// objectFields splits a JSON object (an empty body is {}) into its keys and
// raw values, in order. A key given twice keeps its last value, as a JSON
// decoder would, at its first place.
func objectFields(body []byte) ([]string, []json.RawMessage, error) { return fields(body, true) }

// maxReadFields is how many members objectFields reads by hand (it checks
// for a repeated key by comparing with each before).
const maxReadFields = 64

// readFields splits a valid body by hand, when it can: its values are
// slices of body, which the request owns.
func readFields(body []byte) ([]string, []json.RawMessage, bool) {
	var keys []string
	var vals []json.RawMessage
	ok := jsonr.Members(body, func(k, v []byte) bool {
		// A repeated key or one whose bad bytes the decoder replaces is
		// left to it.
		key := string(k)
		if len(keys) == maxReadFields || !utf8.Valid(k) || slices.Contains(keys, key) {
			return false
		}
		keys = append(keys, key)
		vals = append(vals, v)
		return true
	})
	return keys, vals, ok
}

// fields is objectFields; fast false reads with encoding/json only, which
// the hand-written reader must agree with.
func fields(body []byte, fast bool) ([]string, []json.RawMessage, error) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return nil, nil, nil
	}
	if fast && json.Valid(body) {
		if keys, vals, ok := readFields(body); ok {
			return keys, vals, nil
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, nil, fmt.Errorf("not a JSON object")
	}
	var keys []string
	var vals []json.RawMessage
	at := map[string]int{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		k, _ := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, nil, err
		}
		if i, ok := at[k]; ok {
			vals[i] = v
			continue
		}
		at[k] = len(keys)
		keys = append(keys, k)
		vals = append(vals, v)
	}
	return keys, vals, nil
}
