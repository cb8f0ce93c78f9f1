package http_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/owner"
)

// TestSeedFloodPastMaxSessions: 40 concurrent seeds against max_sessions 5
// start exactly 5 sandboxes; the rest are 503 at_capacity with Retry-After
// and start and track nothing. An ended session frees its place.
func TestSeedFloodPastMaxSessions(t *testing.T) {
	h := newHarness(t, withOwner(func(c *owner.Config) { c.MaxSessions = 5 }))
	const seeds = 40
	agents := make([]*agent, seeds)
	replies := make([]reply, seeds)
	var wg sync.WaitGroup
	for i := range agents {
		agents[i] = &agent{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i] = h.post(agents[i], fmt.Sprintf("/ng-rollout/r%d/seed_session", i), nil)
		}()
	}
	wg.Wait()
	var admitted []*agent
	for i, r := range replies {
		switch {
		case r.status == 200:
			admitted = append(admitted, agents[i])
		case r.status == 503 && r.code() == httpapi.CodeAtCapacity && r.header["Retry-After"] == httpapi.AtCapacityRetryAfter:
		default:
			t.Fatalf("seed %d: %d %s (Retry-After %q)", i, r.status, r.body, r.header["Retry-After"])
		}
	}
	if len(admitted) != 5 {
		t.Fatalf("%d seeds admitted, want 5", len(admitted))
	}
	st := h.fake().Stats()
	if st.Started != 5 || st.LiveSandboxes != 5 {
		t.Fatalf("provider started %d, holds %d; want 5 and 5", st.Started, st.LiveSandboxes)
	}
	ids, err := h.own.Sessions()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, a := range admitted {
		want = append(want, sessionID(a))
	}
	sort.Strings(want)
	if diff := cmp.Diff(want, ids); diff != "" {
		t.Fatalf("tracked sessions (-admitted +tracked):\n%s", diff)
	}
	// A refused seed's agent has no session: its tool call is refused.
	for i, r := range replies {
		if r.status == 503 {
			h.want(h.post(agents[i], "/append_note", map[string]any{"line": "x"}), 409, httpapi.CodeNoSessionSandbox, "append after a refused seed")
			break
		}
	}
	// A restored or existing session's re-seed is not a new one.
	h.ok(h.post(admitted[0], "/ng-rollout/r0/seed_session", nil), "re-seed of an admitted session")
	h.ok(h.post(admitted[0], "/close_session", nil), "close")
	h.ok(h.post(&agent{}, "/ng-rollout/late/seed_session", nil), "seed once a place is free")
	h.want(h.post(&agent{}, "/ng-rollout/later/seed_session", nil), 503, httpapi.CodeAtCapacity, "seed past the bound again")
}

// TestIdleSessionIsEnded: with a one-hour idle timeout on the injected
// clock, a session whose agent keeps calling lives on and one left alone is
// ended (its sandbox stopped, its snapshots kept), logged with its id.
func TestIdleSessionIsEnded(t *testing.T) {
	h := newHarness(t, withOwner(func(c *owner.Config) { c.IdleTimeout = time.Hour }))
	busy, idle := &agent{}, &agent{}
	h.ok(h.post(busy, "/ng-rollout/r1/seed_session", nil), "seed busy")
	h.ok(h.post(idle, "/ng-rollout/r2/seed_session", nil), "seed idle")
	h.checkpoint("ck1", "/ck/1") // the idle session's snapshot must outlive it
	h.op("resume", "ck1", nil)
	idleBox := h.sandboxID(idle)
	h.clk.Advance(50 * time.Minute)
	h.ok(h.post(busy, "/append_note", map[string]any{"line": "still working"}), "append at 50 min")
	h.clk.Advance(10*time.Minute - time.Second)
	if ended, err := h.own.ReapIdle(context.Background(), h.clk.Now()); err != nil || len(ended) != 0 {
		t.Fatalf("reap a second before the timeout: %v, %v", ended, err)
	}
	h.clk.Advance(time.Second)
	ended, err := h.own.ReapIdle(context.Background(), h.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{sessionID(idle)}, ended); diff != "" {
		t.Fatalf("ended (-want +got):\n%s", diff)
	}
	if h.live(idleBox) {
		t.Error("the idle session's sandbox is still running")
	}
	logged := false
	for _, e := range h.log.AllEntries() {
		if e.Data["session_id"] == sessionID(idle) && e.Data["sandbox_id"] == idleBox {
			logged = true
		}
	}
	if !logged {
		t.Error("the idle end was not logged with its session_id")
	}
	h.want(h.post(idle, "/append_note", map[string]any{"line": "late"}), 409, httpapi.CodeNoSessionSandbox, "append on the ended session")
	h.ok(h.post(busy, "/append_note", map[string]any{"line": "after"}), "append on the busy session")
	ck, err := h.own.Index().Checkpoint("ck1")
	if err != nil || len(ck.Records) != 2 {
		t.Fatalf("checkpoint ck1 after the idle end: %v records, %v", len(ck.Records), err)
	}
	// The next checkpoint exports the session left.
	c := h.checkpoint("ck2", "/ck/2")
	if eps := c["episode_ids"].([]any); len(eps) != 1 || eps[0] != "r1" {
		t.Fatalf("checkpoint after the idle end exported %v, want r1", eps)
	}
	h.op("resume", "ck2", nil)
	// The timeout counts from the last use: a session is never ended
	// while a call of it runs.
	done, release := h.heldAppend(busy, "/append_note")
	h.clk.Advance(2 * time.Hour)
	if ended, err := h.own.ReapIdle(context.Background(), h.clk.Now()); err != nil || len(ended) != 0 {
		t.Fatalf("reap with a call in flight: %v, %v", ended, err)
	}
	release()
	h.ok(<-done, "the held append")
}

// TestRestoreAfterTheOwnerEndedEverySession: sessions the owner ended on its
// own (idle) do not count as live: a restore into the same process, once
// nothing is live, is allowed.
func TestRestoreAfterTheOwnerEndedEverySession(t *testing.T) {
	h := newHarness(t, withOwner(func(c *owner.Config) { c.IdleTimeout = time.Hour }))
	a := &agent{}
	h.ok(h.post(a, "/ng-rollout/r1/seed_session", nil), "seed")
	h.checkpoint("ck1", "/ck/1")
	h.op("resume", "ck1", nil)
	h.clk.Advance(2 * time.Hour)
	if ended, err := h.own.ReapIdle(context.Background(), h.clk.Now()); err != nil || len(ended) != 1 {
		t.Fatalf("reap: %v, %v", ended, err)
	}
	rep := h.op("restore", "rs", map[string]any{"source_checkpoint_id": "ck1", "episode_ids": []any{ep("r1", 0)}})
	if diff := cmp.Diff([]any{"r1-a1"}, rep["restored"]); diff != "" {
		t.Fatalf("restored (-want +got):\n%s", diff)
	}
}
