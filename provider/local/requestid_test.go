package local

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/provider"
)

// TestLinesNameTheirRequest: what the provider logs about a call (a start,
// an exec, a snapshot, its delete, a stop) carries the id of the request
// the call's context serves.
func TestLinesNameTheirRequest(t *testing.T) {
	t.Parallel()
	lg, hook := logtest.NewNullLogger()
	lg.SetLevel(logrus.DebugLevel)
	p := newProvider(t, mode{"none-copy", IsolationNone, OverlayOff}, Options{Logger: lg})
	in := func(id string) context.Context { return logs.WithRequestID(context.Background(), id) }
	h, err := p.Start(in("start-1"), provider.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(in("exec-2"), h, provider.ExecRequest{Command: "true"}); err != nil {
		t.Fatal(err)
	}
	snap, err := p.Snapshot(in("snapshot-3"), h, "s")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.DeleteSnapshot(in("delete-4"), snap); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(in("stop-5"), h); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range hook.AllEntries() {
		id, _ := e.Data[logs.RequestID].(string)
		got[e.Message] = id
	}
	want := map[string]string{
		"local: sandbox started":  "start-1",
		"local: exec":             "exec-2",
		"local: snapshot taken":   "snapshot-3",
		"local: snapshot removed": "delete-4",
		"local: sandbox stopped":  "stop-5",
	}
	for msg := range got {
		if _, ok := want[msg]; !ok {
			delete(got, msg)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("request ids of the provider's lines (-want +got):\n%s", diff)
	}
}
