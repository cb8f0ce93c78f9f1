// Package replytest is what the tests that drive this server over HTTP
// share: the body a request sends, and the JSON object or error envelope a
// reply carries. Tests alone import it.
package replytest

import (
	"encoding/json"
	"testing"

	"github.com/sandboxowner/owner/internal/envelope"
)

// Encode is a request's body: none for nil, a string or []byte as it is,
// anything else as JSON.
func Encode(body any) ([]byte, error) {
	switch b := body.(type) {
	case nil:
		return nil, nil
	case string:
		return []byte(b), nil
	case []byte:
		return b, nil
	default:
		return json.Marshal(b)
	}
}

// Object decodes a reply's body as a JSON object; one that is not fails t.
func Object(t testing.TB, status int, body []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("reply %d is not a JSON object: %s", status, body)
	}
	return m
}

// Code is the error envelope's code in body, "" where there is none.
func Code(body []byte) string {
	var e envelope.Body
	_ = json.Unmarshal(body, &e)
	return e.Error.Code
}
