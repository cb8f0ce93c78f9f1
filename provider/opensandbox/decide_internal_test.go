package opensandbox

import (
	"bufio"
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
)

// TestAWaitSleepsWhatItLearntThenPollsFromTheShortest: a wait of a kind
// seen before first sleeps 9/10 of what such waits took, when that is
// longer than the first poll, then polls from PollInterval/8 doubling;
// a learnt sleep no longer than the first poll is the first poll.
func TestAWaitSleepsWhatItLearntThenPollsFromTheShortest(t *testing.T) {
	const ms = time.Millisecond
	for _, tc := range []struct {
		name    string
		typical time.Duration
		before  time.Duration // spent before the first poll (the request)
		want    []time.Duration
	}{
		{"nothing learnt", 0, 0, []time.Duration{125 * ms, 250 * ms, 500 * ms, time.Second, time.Second}},
		{"longer than the first poll", 10 * time.Second, 0, []time.Duration{9 * time.Second, 125 * ms, 250 * ms, 500 * ms, time.Second}},
		// 9/10 of it is exactly the first poll, 125 ms.
		{"as long as the first poll", 138888889, 0, []time.Duration{125 * ms, 250 * ms, 500 * ms, time.Second, time.Second}},
		{"shorter than the first poll", 100 * ms, 0, []time.Duration{125 * ms, 250 * ms, 500 * ms, time.Second, time.Second}},
		// The learnt sleep counts from the wait's start.
		{"after a slow request", 10 * time.Second, 2 * time.Second, []time.Duration{7 * time.Second, 125 * ms, 250 * ms, 500 * ms, time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, clk, slept := pollingProvider(t)
			if tc.typical > 0 {
				p.typical[waitCreate] = tc.typical
			}
			w := p.poller(waitCreate, clk.Now().Add(time.Hour))
			clk.Advance(tc.before)
			for range tc.want {
				if err := w.wait(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			if diff := cmp.Diff(tc.want, *slept); diff != "" {
				t.Errorf("sleeps (-want +got):\n%s", diff)
			}
		})
	}
}

// pollingProvider is a provider polling every second on a manual clock
// that its sleeps advance, and the sleeps it took.
func pollingProvider(t *testing.T) (*Provider, *clock.Manual, *[]time.Duration) {
	t.Helper()
	clk := clock.NewManual(time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC))
	slept := new([]time.Duration)
	p, err := New(Options{Domain: "x:1", PollInterval: time.Second, Clock: clk, Sleep: func(ctx context.Context, d time.Duration) error {
		*slept = append(*slept, d)
		clk.Advance(d)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	return p, clk, slept
}

// TestAForksLabelsBecomeExactlyItsOwn: whatever a fork came up with
// (inherited labels, inherited values that differ, labels missing), its
// labels are made the ones it was given; the server's own stay.
func TestAForksLabelsBecomeExactlyItsOwn(t *testing.T) {
	srv := opensandboxtest.NewServer(opensandboxtest.Options{})
	t.Cleanup(srv.Close)
	p, err := New(Options{Domain: srv.Domain})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	h, err := p.Start(ctx, provider.Spec{Image: "x", Metadata: map[string]string{"ng.session": "s1", "ng.restore": "ck-0", "ng.owner": "me"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Stop(ctx, h) })
	want := map[string]string{"ng.session": "s2", "ng.owner": "me", "ng.role": "fork"}
	if err := p.ownLabels(ctx, h.SandboxID, want); err != nil {
		t.Fatal(err)
	}
	got, ok := srv.SandboxMetadata(h.SandboxID)
	if !ok {
		t.Fatal("the sandbox is gone")
	}
	maps.DeleteFunc(got, func(k, _ string) bool { return strings.HasPrefix(k, "opensandbox.io/") })
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
}

// TestANewSnapshotIsFollowedAtItsLocation: a Location naming one snapshot
// of this API is followed; anything else falls back to the snapshot's id.
func TestANewSnapshotIsFollowedAtItsLocation(t *testing.T) {
	for _, tc := range []struct{ location, want string }{
		{"/v1/snapshots/other", "/snapshots/other"},
		{"/v1/snapshots/a%2Fb", "/snapshots/a%2Fb"},
		{"", "/snapshots/s%2F1"},
		{"/v1/snapshots/", "/snapshots/s%2F1"},
		{"/v1/snapshots/a/b", "/snapshots/s%2F1"},
		{"/v1/snapshots/a?b", "/snapshots/s%2F1"},
		{"/v1/snapshots/a#b", "/snapshots/s%2F1"},
		{"/v2/snapshots/a", "/snapshots/s%2F1"},
		{"http://elsewhere/v1/snapshots/a", "/snapshots/s%2F1"},
	} {
		if got := snapshotPath("s/1", tc.location); got != tc.want {
			t.Errorf("snapshotPath(s/1, %q) = %q, want %q", tc.location, got, tc.want)
		}
	}
}

// TestWhatAWaitLearnsIsAMovingAverage: each wait that ends well moves the
// typical wait a quarter of the way to what it took (until its last poll
// that found it not ready), and the next wait of its kind sleeps 9/10 of
// that first.
func TestWhatAWaitLearnsIsAMovingAverage(t *testing.T) {
	p, clk, slept := pollingProvider(t)
	// A wait that found it not ready after 10 s, then one after 2 s.
	for _, took := range []time.Duration{10 * time.Second, 2 * time.Second} {
		w := p.poller(waitSnapshot, clk.Now().Add(time.Hour))
		clk.Advance(took)
		w.pending = clk.Now() // its last poll that found it not ready
		w.done()
	}
	*slept = nil
	w := p.poller(waitSnapshot, clk.Now().Add(time.Hour))
	if err := w.wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	// (3*10 s + 2 s) / 4 = 8 s; 9/10 of it.
	if diff := cmp.Diff([]time.Duration{7200 * time.Millisecond}, *slept); diff != "" {
		t.Errorf("the first sleep of the third wait (-want +got):\n%s", diff)
	}
}

// TestAnOperationIsBoundedByItsAttempts: one operation (a call and its
// retries) may take each attempt's request timeout, and a minute for the
// backoff between them.
func TestAnOperationIsBoundedByItsAttempts(t *testing.T) {
	for _, tc := range []struct {
		retries int
		want    time.Duration
	}{
		{-1, 10*time.Second + time.Minute}, // no retries: one attempt
		{2, 30*time.Second + time.Minute},
	} {
		p, err := New(Options{Domain: "x:1", MaxRetries: tc.retries, RequestTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if got := p.opTimeout(); got != tc.want {
			t.Errorf("with %d retries an operation is bounded at %v, want %v", tc.retries, got, tc.want)
		}
	}
}

// TestACutLineOfEscapesKeepsAllThatFits: of a line cut at the frame bound
// whose every byte is escaped in six (control characters), the text kept
// still fills what room the output has left.
func TestACutLineOfEscapesKeepsAllThatFits(t *testing.T) {
	out := &capped{max: 20}
	out.add("0123456789") // 10 bytes of room left
	c, text, ok := partialLine([]byte(`{"type":"stdout","text":"`+strings.Repeat(`\u0001`, 1000)), out, nil)
	if !ok || c != out || len(text) < 10 || strings.Trim(text, "\x01") != "" {
		t.Errorf("partialLine = %v %q (%d bytes), %v; want at least the 10 bytes of room, all \\x01", c == out, text, len(text), ok)
	}
}

// TestALineIsKeptToTheFrameCapAcrossChunks: a line longer than the frame
// cap is cut at the cap and says so, however many reads it took.
func TestALineIsKeptToTheFrameCapAcrossChunks(t *testing.T) {
	long := strings.Repeat("x", 100)
	br := bufio.NewReaderSize(strings.NewReader(long+"\nnext\n"), 16) // 16-byte chunks
	line, cut, err := readLine(br, 40)
	if err != nil || !cut || string(line) != long[:40] {
		t.Errorf("readLine = %q (%d bytes), cut %v, %v; want the first 40 bytes, cut", line, len(line), cut, err)
	}
	if line, cut, err := readLine(br, 40); err != nil || cut || string(line) != "next" {
		t.Errorf("the next line = %q, cut %v, %v; want \"next\" whole", line, cut, err)
	}
}
