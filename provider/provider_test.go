package provider

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSpecAndHandleRoundTripThroughJSON(t *testing.T) {
	spec := Spec{
		Image: "notes", Workdir: "/work", Env: map[string]string{"A": "1"},
		Files: map[string]string{"a.txt": "x"}, Metadata: map[string]string{"owner": "o"},
		TTLSeconds: 60, Resources: &Resources{CPU: 2, MemoryMiB: 512}, Network: true,
		Ports: []int{8080}, ProviderOptions: map[string]any{"snapshot_id": "s1"},
	}
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	var got Spec
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(spec, got); d != "" {
		t.Fatalf("spec round trip (-want +got):\n%s", d)
	}
	h := Handle{SandboxID: "sb-1", Provider: "fake", Descriptor: json.RawMessage(`{"sandbox_id":"sb-1"}`)}
	b, err = json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	var gh Handle
	if err := json.Unmarshal(b, &gh); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(h, gh); d != "" {
		t.Fatalf("handle round trip (-want +got):\n%s", d)
	}
}

func TestSpecTTL(t *testing.T) {
	if got := (Spec{TTLSeconds: 1.5}).TTL().Milliseconds(); got != 1500 {
		t.Fatalf("TTL = %dms, want 1500ms", got)
	}
}
