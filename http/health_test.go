package http_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/resources/notes"
	"github.com/sandboxowner/owner/retention"
)

// reporting is the notes server adding its own fields to /health, one of
// them named like a base field.
type reporting struct{ *notes.Server }

func (reporting) Health() map[string]any { return map[string]any{"queue": 2.0, "status": "mine"} }

// TestHealthReportsWhatTheServerIsGiven: /health answers 503
// provider_unreachable with the provider's error while it is down, the
// counts its callbacks give (none that failed), the retention checks while
// they follow the directories, the sweep, and the resources server's own
// fields without letting them replace a base field; a POST is 405.
func TestHealthReportsWhatTheServerIsGiven(t *testing.T) {
	broken := errors.New("broken")
	for _, tc := range []struct {
		name   string
		config func(*httpapi.Config)
		status int
		want   map[string]any
	}{
		{"down", func(c *httpapi.Config) {
			c.ProviderDown = func() error { return errors.New("no route to the stack") }
			c.PendingDeletes = func() (int, error) { return 2, nil }
			c.CheckpointsHeld = func() (int, error) { return 0, broken }
			c.Retention = func() owner.RetentionStatus {
				return owner.RetentionStatus{FollowDirs: true, Grace: 90 * time.Second,
					Pending:    []retention.Pending{{ID: "ck1", Dir: "/d/1"}, {ID: "ck2", Dir: "/d/2"}},
					Unreadable: []retention.Problem{{ID: "ck3", Dir: "/d/3"}}}
			}
			c.Sweep = func() map[string]any { return map[string]any{"passes": 3} }
		}, 503, map[string]any{
			"status": "provider_unreachable", "provider_error": "no route to the stack", "name": "notes", "mode": "exported",
			"pending_snapshot_deletes": 2.0,
			"retention":                map[string]any{"follow_dirs": true, "grace_s": 90.0, "dirs_gone": []any{"ck1", "ck2"}, "dirs_unreadable": []any{"ck3"}},
			"sweep":                    map[string]any{"passes": 3.0},
			"queue":                    2.0,
		}},
		{"up", func(c *httpapi.Config) {
			c.ProviderDown = func() error { return nil }
			c.PendingDeletes = func() (int, error) { return 0, broken }
			c.CheckpointsHeld = func() (int, error) { return 4, nil }
			c.Retention = func() owner.RetentionStatus { return owner.RetentionStatus{FollowDirs: false, Grace: time.Second} }
		}, 200, map[string]any{"status": "ok", "name": "notes", "mode": "exported", "checkpoints_held": 4.0, "queue": 2.0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, withResources(reporting{notes.New(notes.Options{})}), withConfig(tc.config))
			r := h.do(nil, "GET", httpapi.RouteHealth, nil, nil)
			if r.status != tc.status {
				t.Errorf("status %d, want %d", r.status, tc.status)
			}
			if diff := cmp.Diff(tc.want, r.json(t)); diff != "" {
				t.Errorf("/health (-want +got):\n%s", diff)
			}
			h.want(h.do(nil, "POST", httpapi.RouteHealth, nil, nil), 405, httpapi.CodeMethod, "POST /health")
		})
	}
}
