package records

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/provider"
)

// gymScript reads our files with Gym's own reader and writes the records it
// read with Gym's own writer into a second directory, then prints both
// manifests. Gym's errors module imports fastapi for its HTTP responses;
// where fastapi is absent a stand-in module satisfies that import (no
// response is built here).
const gymScript = `
import json, sys, types
from pathlib import Path
try:
    import fastapi.responses
except ImportError:
    f = types.ModuleType("fastapi"); r = types.ModuleType("fastapi.responses")
    r.JSONResponse = object; f.responses = r
    sys.modules["fastapi"] = f; sys.modules["fastapi.responses"] = r
from nemo_gym._checkpoint.store import read_participant_state, write_participant_state
src, dst, instance = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
manifest, records = read_participant_state(src, kind="resources", instance=instance)
again = write_participant_state(dst, kind="resources", instance=instance,
    checkpoint_id=manifest["checkpoint_id"], records=records)
print(json.dumps({"read": manifest, "rewritten": again, "records": records}))
`

func gymSources(t *testing.T) string {
	t.Helper()
	src, err := filepath.Abs("../../shared/gym/src")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(src, "nemo_gym", "_checkpoint", "store.py")); err != nil {
		t.Skip("../shared/gym is absent: Gym's records reader cannot run here")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed: Gym's records reader cannot run here")
	}
	return src
}

func sampleRecords() []Record {
	at := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	return []Record{
		{
			EpisodeID: EpisodeOf("r1"), SessionID: "s1",
			State: State{
				Sandbox: SandboxState{
					ProviderName: "local",
					Descriptor:   provider.Handle{SandboxID: "sb-1", Provider: "local"},
					SnapshotID:   "snap-1",
					Spec:         provider.Spec{Image: "notes", Workdir: "/sandbox", Env: map[string]string{"B": "2", "A": "<&>"}, TTLSeconds: 3600},
					SnapshotAt:   UnixSeconds(at),
				},
				Workdir: "/sandbox",
				Data:    json.RawMessage(`{"token":"é✓😀","z":1,"a":[1.5,2e-7,null,1.0,1e2,0.00001,1e16,1.5E+16,-0.0]}`),
			},
		},
		{
			EpisodeID: EpisodeOf("r2-a3"), SessionID: "s2",
			State: State{Sandbox: SandboxState{ProviderName: "local", SnapshotID: "snap-2", Descriptor: provider.Handle{SandboxID: "sb-2", Provider: "local", Descriptor: json.RawMessage(`{"sandbox_id":"sb-2"}`)}}, Workdir: "/w"},
		},
	}
}

// Gym's reader accepts what Commit writes (kind resources, the server's
// name as instance), and Gym's writer, given the records it read, writes
// the same file under the same name: our lines are Python's.
func TestGymReadsOurRecords(t *testing.T) {
	src := gymSources(t)
	ck, again := filepath.Join(t.TempDir(), "ck"), filepath.Join(t.TempDir(), "again")
	recs := sampleRecords()
	ls := make([][]byte, len(recs))
	for i, r := range recs {
		var err error
		if ls[i], err = r.Line(); err != nil {
			t.Fatal(err)
		}
	}
	ours, err := Writer{FS: OS{}, Participant: part}.Write(ck, "ckpt-1", ls, nil)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("python3", "-c", gymScript, ck, again, "notes")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+src)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("Gym's reader refused our records: %v\n%s", err, out)
	}
	var got struct {
		Read, Rewritten Manifest
		Records         []json.RawMessage
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if diff := cmp.Diff(ours, got.Read); diff != "" {
		t.Fatalf("Gym read another manifest (-ours +gym):\n%s", diff)
	}
	if diff := cmp.Diff(ours, got.Rewritten); diff != "" {
		t.Fatalf("Gym's writer named the same records otherwise (-ours +gym):\n%s", diff)
	}
	for _, name := range []string{ours.RecordsFile, ManifestName} {
		a, _ := os.ReadFile(filepath.Join(ck, "gym", "resources", "notes", name))
		b, _ := os.ReadFile(filepath.Join(again, "gym", "resources", "notes", name))
		if string(a) != string(b) {
			t.Fatalf("%s differs:\nours %s\ngym  %s", name, a, b)
		}
	}
	if len(got.Records) != 2 || !strings.Contains(string(got.Records[1]), `"attempt": 3`) {
		t.Fatalf("records as Gym read them: %s", out)
	}
}
