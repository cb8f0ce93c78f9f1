package process_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/provider/local"
	"github.com/sandboxowner/owner/provider/local/localtest"
	"github.com/sandboxowner/owner/records"
)

// gymDriver runs NeMo Gym's own controller code (its CollectionCheckpointer
// and coordination calls, from ../shared/gym) in a Python process that
// takes one JSON command a line and answers one JSON line. Gym's prints go
// to stderr. Gym's errors module imports fastapi for its HTTP replies and
// its settings omegaconf for its config type; where they are absent a
// stand-in satisfies the import (no reply is built, and the config is a
// plain dict).
const gymDriver = `
import asyncio, json, sys, types
try:
    import fastapi.responses
except ImportError:
    f = types.ModuleType("fastapi"); r = types.ModuleType("fastapi.responses")
    r.JSONResponse = object; f.responses = r
    sys.modules["fastapi"] = f; sys.modules["fastapi.responses"] = r
try:
    import omegaconf
except ImportError:
    o = types.ModuleType("omegaconf")
    class DictConfig: pass
    class OmegaConf:
        @staticmethod
        def to_container(c, resolve=True): return c
    o.DictConfig, o.OmegaConf = DictConfig, OmegaConf
    sys.modules["omegaconf"] = o
from pathlib import Path
from nemo_gym import server_utils
from nemo_gym._checkpoint import collection, coordination, store

TOKEN = sys.argv[1]
replies, sys.stdout = sys.stdout, sys.stderr

def checkpointer(port, root):
    gcd = {"checkpoint": {"enabled": True, "control_auth_token": TOKEN},
           "notes": {"resources_servers": {"notes": {"host": "127.0.0.1", "port": port}}}}
    client = server_utils.ServerClient(gcd)
    cp = collection.CollectionCheckpointer(Path(root), client, timeout_s=120)
    # discover() wants a whole deployment (a policy model too): one server's
    # participants are named by hand, as Gym's own tests do.
    cp._participants = coordination.Participants(client=client, auth_token=TOKEN,
        members=(coordination.Participant(server_name="notes", kind="resources"),))
    return cp

async def main():
    cp = None
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        cmd = json.loads(line)
        try:
            op, out = cmd["op"], {}
            if op == "open":
                cp = checkpointer(cmd["port"], cmd["root"])
                if cmd.get("fresh"):
                    cp.reset()
            elif op == "dispatch":
                await cp.before_dispatch(cmd["rollout_id"], cmd["attempt"])
            elif op == "checkpoint":
                p = await cp.checkpoint()
                out = {"published": str(p) if p is not None else None}
            elif op == "read":
                manifest, recs = store.read_participant_state(Path(cmd["dir"]), kind="resources", instance=cmd["instance"])
                out = {"manifest": manifest, "records": len(recs)}
            elif op == "restore":
                out = {"attempts": await cp.restore(cmd["attempts"])}
            else:
                out = {"error": "unknown op " + op}
        except Exception as e:
            out = {"error": repr(e)}
        replies.write(json.dumps(out) + "\n"); replies.flush()

asyncio.run(main())
`

type gym struct {
	t      *testing.T
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	stderr *serverLog
}

// gymSources finds Gym's controller code and a Python that runs it, or
// skips.
func gymSources(t *testing.T) string {
	t.Helper()
	src, err := filepath.Abs("../../../shared/gym/src")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(src, "nemo_gym", "_checkpoint", "collection.py")); err != nil {
		t.Skip("../shared/gym is absent: Gym's controller cannot run here")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed: Gym's controller cannot run here")
	}
	if out, err := exec.Command("python3", "-c", "import pydantic, requests, orjson; assert pydantic.VERSION.startswith('2')").CombinedOutput(); err != nil {
		t.Skipf("python3 lacks pydantic v2, requests or orjson, which Gym's controller imports: %s", strings.TrimSpace(lastLines(string(out), 1)))
	}
	return src
}

func startGym(t *testing.T) *gym {
	t.Helper()
	src := gymSources(t)
	cmd := exec.Command("python3", "-c", gymDriver, token)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+src)
	g := &gym{t: t, cmd: cmd, stderr: &serverLog{}}
	cmd.Stderr = g.stderr
	var err error
	if g.in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	g.out = bufio.NewScanner(out)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = g.in.Close()
		_ = cmd.Wait()
	})
	return g
}

// do sends one command and returns Gym's answer; an error answer fails.
func (g *gym) do(cmd map[string]any) map[string]any {
	g.t.Helper()
	b, _ := json.Marshal(cmd)
	if _, err := g.in.Write(append(b, '\n')); err != nil {
		g.t.Fatalf("gym %v: %v\n%s", cmd, err, g.stderr)
	}
	type line struct {
		b  []byte
		ok bool
	}
	got := make(chan line, 1)
	go func() { ok := g.out.Scan(); got <- line{slices.Clone(g.out.Bytes()), ok} }()
	var l line
	select {
	case l = <-got:
	case <-time.After(5 * time.Minute): // a guard against a hang, not a wait
		g.t.Fatalf("gym %v did not answer:\n%s", cmd, g.stderr)
	}
	if !l.ok {
		g.t.Fatalf("gym %v: the driver exited:\n%s", cmd, g.stderr)
	}
	var out map[string]any
	if err := json.Unmarshal(l.b, &out); err != nil || out["error"] != nil {
		g.t.Fatalf("gym %v: %s %v\n%s", cmd, l.b, err, g.stderr)
	}
	return out
}

func (g *gym) open(s *server, root string, fresh bool) {
	g.t.Helper()
	_, port, _ := strings.Cut(s.addr, ":")
	g.do(map[string]any{"op": "open", "port": port, "root": root, "fresh": fresh})
}

func (g *gym) dispatch(rollout string, attempt int) {
	g.t.Helper()
	g.do(map[string]any{"op": "dispatch", "rollout_id": rollout, "attempt": attempt})
}

func (g *gym) checkpoint() string {
	g.t.Helper()
	p, _ := g.do(map[string]any{"op": "checkpoint"})["published"].(string)
	if p == "" {
		g.t.Fatalf("Gym's checkpoint was not published:\n%s", g.stderr)
	}
	return p
}

// notesServer starts the server on the local provider with the retention
// flags given.
func notesServer(t *testing.T, dir string, flags ...string) *server {
	t.Helper()
	return startWith(t, dir, append([]string{"-sandbox.provider", "local", "-sandbox.local.isolation", "none", "-sandbox.local.overlay", "off"}, flags...)...)
}

// TestGymCheckpointKillRestore: two episodes under Gym's own controller, a
// checkpoint, drift, a SIGKILL of the server, a fresh process restored by
// the controller's restore; the re-seeded attempts continue from the
// checkpoint and verify with reward 1.
func TestGymCheckpointKillRestore(t *testing.T) {
	t.Parallel()
	g := startGym(t)
	dir := t.TempDir()
	root := filepath.Join(t.TempDir(), "checkpoints")
	s := notesServer(t, dir)
	g.open(s, root, true)
	agents := map[string]*agent{"r1": newAgent(), "r2": newAgent()}
	for _, r := range []string{"r1", "r2"} {
		g.dispatch(r, 0)
		s.ok(agents[r], "/ng-rollout/"+r+"/seed_session", map[string]any{})
		s.ok(agents[r], "/ng-rollout/"+r+"/append_note", map[string]any{"line": "one-" + r})
	}
	published := g.checkpoint()
	// Gym's own reader of a participant's files reads what the server
	// wrote there.
	read := g.do(map[string]any{"op": "read", "dir": published, "instance": "notes"})
	if m := read["manifest"].(map[string]any); read["records"] != 2.0 || m["kind"] != "resources" || m["instance"] != "notes" || m["record_count"] != 2.0 {
		t.Fatalf("Gym's reader of %s: %v", published, read)
	}
	s.ok(agents["r1"], "/ng-rollout/r1/append_note", map[string]any{"line": "lost"})
	s.kill()

	s = notesServer(t, dir)
	g.open(s, root, false)
	got := g.do(map[string]any{"op": "restore", "attempts": map[string]int{"r1": 0, "r2": 0}})["attempts"]
	if diff := cmp.Diff(map[string]any{"r1": 1.0, "r2": 1.0}, got); diff != "" {
		t.Fatalf("the controller's restore (-want +got):\n%s\n%s", diff, s.log)
	}
	for _, r := range []string{"r1", "r2"} {
		key := "/ng-rollout/" + r + "-a1/"
		s.ok(agents[r], key+"seed_session", map[string]any{})
		s.ok(agents[r], key+"append_note", map[string]any{"line": "two"})
		v := s.ok(agents[r], key+"verify", map[string]any{"expected_notes": []string{"one-" + r, "two"}})
		if v["reward"] != 1.0 {
			t.Errorf("%s: verify of the restored attempt: %v", r, v)
		}
	}
}

// retentionStep is one checkpoint's figures.
type retentionStep struct {
	Dirs                        int // checkpoint directories Gym keeps
	Held, Snapshots             int // after the commit
	HeldFirst, SnapshotsFirst   int // after the first check
	Pending                     int // seen gone by the first check
	HeldSecond, SnapshotsSecond int // after the second check
}

// TestGymRetentionTenCheckpoints: ten checkpoints through Gym's
// CollectionCheckpointer, which keeps the two newest directories, deletes
// the rest and never calls release. With a grace of 0 s a directory counts
// as gone at the second check that finds it gone; after the two checks
// following each checkpoint (check_retention, here instead of the period)
// the provider holds exactly the snapshots that the existing directories'
// records name.
func TestGymRetentionTenCheckpoints(t *testing.T) {
	t.Parallel()
	g := startGym(t)
	dir := t.TempDir()
	root := filepath.Join(t.TempDir(), "checkpoints")
	s := notesServer(t, dir, "-checkpoint.retention.grace_s", "0", "-checkpoint.retention.period_s", "86400")
	g.open(s, root, true)
	lg := logrus.New()
	lg.SetOutput(io.Discard)
	p, err := local.New(local.Options{Root: filepath.Join(dir, "sandboxes"), Templates: map[string]string{"notes": ""}, Isolation: "none", Overlay: "off", Logger: lg, InitBinary: localtest.InitBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	snapshots := func() []string {
		snaps, err := p.ListSnapshots(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, sn := range snaps {
			ids = append(ids, sn.ID)
		}
		slices.Sort(ids)
		return ids
	}
	held := func() int {
		code, h, err := s.call(nil, "GET", "/health", nil)
		if err != nil || code != 200 {
			t.Fatalf("/health: %d %v", code, err)
		}
		return int(h["checkpoints_held"].(float64))
	}
	check := func() map[string]any {
		code, r, err := s.call(nil, "POST", "/ng-control/v1/checkpoint/check_retention", map[string]any{})
		if err != nil || code != 200 {
			t.Fatalf("check_retention: %d %v %v", code, r, err)
		}
		return r
	}
	agents := map[string]*agent{"r1": newAgent(), "r2": newAgent()}
	for _, r := range []string{"r1", "r2"} {
		g.dispatch(r, 0)
		s.ok(agents[r], "/ng-rollout/"+r+"/seed_session", map[string]any{})
	}
	var steps []retentionStep
	for k := 1; k <= 10; k++ {
		for _, r := range []string{"r1", "r2"} {
			s.ok(agents[r], "/ng-rollout/"+r+"/append_note", map[string]any{"line": fmt.Sprintf("n%d", k)})
		}
		g.checkpoint()
		named := namedByDirs(t, root)
		st := retentionStep{Dirs: len(named), Held: held(), Snapshots: len(snapshots())}
		first := check()
		st.HeldFirst, st.SnapshotsFirst, st.Pending = held(), len(snapshots()), len(first["pending"].([]any))
		check()
		left := snapshots()
		st.HeldSecond, st.SnapshotsSecond = held(), len(left)
		steps = append(steps, st)
		var want []string
		for _, ids := range named {
			want = append(want, ids...)
		}
		slices.Sort(want)
		if diff := cmp.Diff(want, left); diff != "" {
			t.Fatalf("checkpoint %d: the provider's snapshots are not those of the directories Gym kept (-named +held):\n%s", k, diff)
		}
		if len(named) != min(k, 2) {
			t.Fatalf("checkpoint %d: Gym keeps %d directories, want %d", k, len(named), min(k, 2))
		}
	}
	for k, st := range steps {
		t.Logf("checkpoint %2d: Gym keeps %d dirs; after the commit the server holds %d checkpoints, %d snapshots; after check 1: %d, %d (%d dirs seen gone); after check 2: %d, %d",
			k+1, st.Dirs, st.Held, st.Snapshots, st.HeldFirst, st.SnapshotsFirst, st.Pending, st.HeldSecond, st.SnapshotsSecond)
	}
	// The root out of sight (an unmounted filesystem whose mount point is
	// gone too): its directories are unreadable, never gone.
	before := snapshots()
	if err := os.Rename(root, root+".unmounted"); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if r := check(); len(r["unreadable"].([]any)) != 2 || len(r["dropped"].([]any)) != 0 {
			t.Fatalf("check with the root gone: %v", r)
		}
	}
	if diff := cmp.Diff(before, snapshots()); diff != "" {
		t.Fatalf("snapshots deleted with the root out of sight (-before +after):\n%s", diff)
	}
	if n := strings.Count(s.log.String(), `"msg":"checkpoint dropped"`); n != 8 {
		t.Errorf("%d drops logged, want 8 (every checkpoint but the two newest)", n)
	}
}

// namedByDirs reads the records of every checkpoint directory under root
// (this server's, verified as a restore reads them) and returns the
// snapshots each names, by directory.
func namedByDirs(t *testing.T, root string) map[string][]string {
	t.Helper()
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		var ids []string
		_, err := records.Read(records.OS{}, filepath.Join(root, e.Name()), records.Participant{Kind: records.KindResources, Instance: "notes"}, func(line []byte) error {
			r, err := records.ParseRecord(line)
			if err != nil {
				return err
			}
			ids = append(ids, r.State.Sandbox.SnapshotID)
			return nil
		})
		if err != nil {
			t.Fatalf("records of %s: %v", e.Name(), err)
		}
		out[e.Name()] = ids
	}
	return out
}
