package opensandbox

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestAPIErrorReadsTheServersThreeShapes: {code, message}, FastAPI's 422
// {detail: [{loc, msg}]} and {detail: "..."}, execd's {error}, and a body
// that is none of them.
func TestAPIErrorReadsTheServersThreeShapes(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
		want   APIError
	}{
		{409, `{"code":"SNAPSHOT::DELETE_CONFLICT","message":"in use"}`, APIError{Op: "op", Status: 409, Code: "SNAPSHOT::DELETE_CONFLICT", Message: "in use"}},
		{422, `{"detail":[{"type":"greater_than_equal","loc":["body","timeout"],"msg":"Input should be greater than or equal to 60"},{"loc":["query","pageSize"],"msg":"bad"}]}`,
			APIError{Op: "op", Status: 422, Message: "body.timeout: Input should be greater than or equal to 60; query.pageSize: bad"}},
		{404, `{"detail":"Not Found"}`, APIError{Op: "op", Status: 404, Message: "Not Found"}},
		{500, `{"error":"boom"}`, APIError{Op: "op", Status: 500, Message: "boom"}},
		{502, "<html>bad gateway</html>\n", APIError{Op: "op", Status: 502, Message: "<html>bad gateway</html>"}},
	} {
		got := (&response{status: tc.status, header: http.Header{}, body: []byte(tc.body)}).apiError("op")
		if diff := cmp.Diff(tc.want, *got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.body, diff)
		}
	}
}

// A body is read whole, cut at the limit, whatever length it announced;
// an announced length within the limit sizes the buffer once.
func TestReadBody(t *testing.T) {
	data := strings.Repeat("0123456789", 10_000)
	for _, tc := range []struct {
		name          string
		length, limit int64
		want          string
	}{
		{"announced", int64(len(data)), 1 << 20, data},
		{"unknown", -1, 1 << 20, data},
		{"announced short", 10, 1 << 20, data},
		{"announced long", 1 << 19, 1 << 20, data},
		{"past the limit", int64(len(data)), 1000, data[:1000]},
		{"announced past the limit", 1 << 40, 1000, data[:1000]},
	} {
		got, err := readBody(strings.NewReader(data), tc.length, tc.limit)
		if err != nil || string(got) != tc.want {
			t.Errorf("%s: %d bytes (match %v), %v", tc.name, len(got), string(got) == tc.want, err)
		}
	}
	got, _ := readBody(strings.NewReader(data), int64(len(data)), 1<<20)
	if cap(got) != len(data)+bytes.MinRead {
		t.Errorf("a body of its announced length read into a buffer of %d bytes, want %d: grown, not sized", cap(got), len(data)+bytes.MinRead)
	}
	if got, err := readBody(strings.NewReader(""), 0, 1<<20); err != nil || len(got) != 0 {
		t.Errorf("an empty body: %q, %v", got, err)
	}
}

// The real sleep between polls and retries waits at least its duration, and
// ends at once with its context.
func TestSleepReal(t *testing.T) {
	start := time.Now()
	if err := sleepReal(context.Background(), 20*time.Millisecond); err != nil || time.Since(start) < 20*time.Millisecond {
		t.Errorf("a sleep of 20 ms returned %v after %v", err, time.Since(start))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := sleepReal(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("a sleep whose context ended: %v, want context.Canceled", err)
	}
}

// TestRetryAfterTakesSecondsOrAnHTTPDate: Retry-After in whole seconds or
// as an HTTP date (the time left until it); anything else asks no wait.
func TestRetryAfterTakesSecondsOrAnHTTPDate(t *testing.T) {
	now := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"":     0,
		"3":    3 * time.Second,
		"-1":   0,
		"soon": 0,
		now.Add(7 * time.Second).Format(http.TimeFormat): 7 * time.Second,
	} {
		h := http.Header{}
		if v != "" {
			h.Set("Retry-After", v)
		}
		if got := retryAfter(h, now); got != want {
			t.Errorf("Retry-After %q: %v, want %v", v, got, want)
		}
	}
}
