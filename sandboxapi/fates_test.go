package sandboxapi_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/sandboxapi"
)

// fates answers from a table and records the sessions touched.
type fates struct {
	by      map[string]sandbox.Fate
	touched []string
}

func (f *fates) SandboxFate(id string) (string, provider.Handle, sandbox.Fate) {
	return "session-of-" + id, provider.Handle{Provider: "fake", SandboxID: id}, f.by[id]
}

func (f *fates) Touch(sessionID string) { f.touched = append(f.touched, sessionID) }

// A live sandbox resolves to its handle and counts as its session's use
// (an agent working in it keeps the session from its idle end); any other
// fate gives no handle and touches nothing.
func TestResolverOf(t *testing.T) {
	f := &fates{by: map[string]sandbox.Fate{
		"live": sandbox.FateLive, "old": sandbox.FateSuperseded, "done": sandbox.FateEnded, "unknown": sandbox.FateUnknown,
	}}
	resolve := sandboxapi.ResolverOf(f)
	type answer struct {
		Handle provider.Handle
		Fate   sandbox.Fate
	}
	var got []answer
	for _, id := range []string{"live", "old", "done", "unknown"} {
		h, fate := resolve(id)
		got = append(got, answer{h, fate})
	}
	want := []answer{
		{provider.Handle{Provider: "fake", SandboxID: "live"}, sandbox.FateLive},
		{provider.Handle{}, sandbox.FateSuperseded},
		{provider.Handle{}, sandbox.FateEnded},
		{provider.Handle{}, sandbox.FateUnknown},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("resolved (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"session-of-live"}, f.touched); diff != "" {
		t.Errorf("touched (-want +got):\n%s", diff)
	}
}
