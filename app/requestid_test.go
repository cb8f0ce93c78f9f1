package app_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/sandboxowner/owner/app"
	"github.com/sandboxowner/owner/provider/fake"
)

// TestOwnerLinesNameTheirRequest: the lines the owner logs about a control
// call (a commit, a restore, a release that drops checkpoints) carry the
// call's request id.
func TestOwnerLinesNameTheirRequest(t *testing.T) {
	t.Parallel()
	dir, prov := t.TempDir(), fake.New(fake.Options{})
	a, hook, stop := startFake(t, dir, prov, app.Deps{})
	addr := a.Addr().String()
	if s, body, _ := post(t, addr, "/ng-rollout/r1/seed_session", "", "{}"); s != 200 {
		t.Fatalf("seed: %d %s", s, body)
	}
	d := time.Now().Add(time.Minute).Unix()
	controlAs(t, addr, "prepare", "prepare-1", fmt.Sprintf(`{"checkpoint_id":"ck1","deadline_ts":%d}`, d))
	controlAs(t, addr, "commit", "commit-2", fmt.Sprintf(`{"checkpoint_id":"ck1","deadline_ts":%d,"checkpoint_dir":%q,"episode_ids":[{"rollout_id":"r1","attempt":0}]}`, d, filepath.Join(dir, "ck1")))
	controlAs(t, addr, "resume", "resume-3", fmt.Sprintf(`{"checkpoint_id":"ck1","deadline_ts":%d}`, d))
	got := requestsOf(hook, "checkpoint committed")
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	b, hook, _ := startFake(t, dir, prov, app.Deps{})
	addr = b.Addr().String()
	controlAs(t, addr, "restore", "restore-4", fmt.Sprintf(`{"checkpoint_id":"rs1","deadline_ts":%d,"source_checkpoint_id":"ck1","episode_ids":[{"rollout_id":"r1","attempt":0}]}`, d))
	controlAs(t, addr, "resume", "resume-5", fmt.Sprintf(`{"checkpoint_id":"rs1","deadline_ts":%d}`, d))
	controlAs(t, addr, "release", "release-6", `{"kept_checkpoint_ids":[]}`)
	got = append(got, requestsOf(hook, "checkpoint restored")...)
	got = append(got, requestsOf(hook, "checkpoint dropped")...)
	want := []string{"commit-2", "restore-4", "release-6"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("request ids of the owner's lines: committed, restored, dropped (-want +got):\n%s", diff)
	}
}

// requestsOf lists the request_id of every line logged with msg, in order.
func requestsOf(hook *logtest.Hook, msg string) []string {
	var out []string
	for _, e := range hook.AllEntries() {
		if e.Message == msg {
			id, _ := e.Data["request_id"].(string)
			out = append(out, id)
		}
	}
	return out
}

// TestSeedAndControlLinesNameTheirRequest: the local provider's line about
// the sandbox a seed started, and the control plane's own lines about a
// prepare and a resume, carry the id of the request that caused them.
func TestSeedAndControlLinesNameTheirRequest(t *testing.T) {
	t.Parallel()
	lg, hook := logtest.NewNullLogger()
	a := startLocalWith(t, t.TempDir(), app.Deps{Logger: lg})
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	addr := a.Addr().String()
	if r, err := send("POST", "http://"+addr+"/ng-rollout/r1/seed_session", "{}", "X-Request-Id", "seed-1"); err != nil || r.status != 200 {
		t.Fatalf("seed: %v %+v", err, r)
	}
	d := time.Now().Add(time.Minute).Unix()
	controlAs(t, addr, "prepare", "prepare-2", fmt.Sprintf(`{"checkpoint_id":"ck1","deadline_ts":%d}`, d))
	controlAs(t, addr, "resume", "resume-3", fmt.Sprintf(`{"checkpoint_id":"ck1","deadline_ts":%d}`, d))
	var got []string
	for _, msg := range []string{"local: sandbox started", "checkpoint prepare: admission closed", "checkpoint resumed: admission open"} {
		got = append(got, requestsOf(hook, msg)...)
	}
	if diff := cmp.Diff([]string{"seed-1", "prepare-2", "resume-3"}, got); diff != "" {
		t.Errorf("request ids of the sandbox's start, the prepare and the resume (-want +got):\n%s", diff)
	}
}
