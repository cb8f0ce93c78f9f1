package fake_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func start(t *testing.T, p provider.Provider, spec provider.Spec) provider.Handle {
	t.Helper()
	h, err := p.Start(context.Background(), spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	return h
}

func snap(t *testing.T, p *fake.Provider, h provider.Handle) string {
	t.Helper()
	id, err := p.Snapshot(context.Background(), h, "n")
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	return id
}

func TestStartHandleRoundTrip(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	p := fake.New(fake.Options{Name: "fk", Clock: clk, IDPrefix: "a-"})
	if p.Name() != "fk" {
		t.Fatalf("Name = %q", p.Name())
	}
	spec := provider.Spec{
		Image:    "img",
		Files:    map[string]string{"rel.txt": "r", "/abs/x": "x", "sub/../y": "y"},
		Metadata: map[string]string{"session": "s1"},
	}
	h := start(t, p, spec)
	want := provider.Handle{SandboxID: "a-sb-1", Provider: "fk", Descriptor: json.RawMessage(`{"sandbox_id":"a-sb-1"}`)}
	if d := cmp.Diff(want, h); d != "" {
		t.Fatalf("handle (-want +got):\n%s", d)
	}
	files, _ := p.Files(h.SandboxID)
	if d := cmp.Diff(map[string]string{"/workspace/rel.txt": "r", "/abs/x": "x", "/workspace/y": "y"}, files); d != "" {
		t.Fatalf("files (-want +got):\n%s", d)
	}

	// A handle that went through JSON, or only its descriptor, still works.
	b, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	var back provider.Handle
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if st, err := p.Status(ctx, back); err != nil || st != provider.StatusRunning {
		t.Fatalf("Status(round-tripped) = %q, %v", st, err)
	}
	if st, err := p.Status(ctx, provider.Handle{Descriptor: h.Descriptor}); err != nil || st != provider.StatusRunning {
		t.Fatalf("Status(descriptor only) = %q, %v", st, err)
	}

	info, ok := p.Sandbox(h.SandboxID)
	wantInfo := provider.SandboxInfo{Handle: want, Status: provider.StatusRunning, Metadata: spec.Metadata, CreatedAt: t0}
	if d := cmp.Diff(wantInfo, info); !ok || d != "" {
		t.Fatalf("Sandbox (-want +got):\n%s", d)
	}
	list, err := p.ListSandboxes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]provider.SandboxInfo{wantInfo}, list); d != "" {
		t.Fatalf("ListSandboxes (-want +got):\n%s", d)
	}
	// The fake keeps its own copy of the metadata, and hands out copies.
	spec.Metadata["session"] = "mutated"
	list[0].Metadata["session"] = "mutated"
	if info, _ := p.Sandbox(h.SandboxID); info.Metadata["session"] != "s1" {
		t.Fatalf("metadata not copied: %v", info.Metadata)
	}

	h2 := start(t, p, provider.Spec{})
	if h2.SandboxID != "a-sb-2" {
		t.Fatalf("second id = %q", h2.SandboxID)
	}
	if err := p.Stop(ctx, back); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(ctx, back); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if err := p.Stop(ctx, provider.Handle{SandboxID: "nope"}); err != nil {
		t.Fatalf("Stop unknown: %v", err)
	}
	if d := cmp.Diff([]string{"a-sb-2"}, p.LiveSandboxIDs()); d != "" {
		t.Fatalf("live (-want +got):\n%s", d)
	}
	st := p.Stats()
	if st.Started != 2 || st.Stopped != 1 || st.LiveSandboxes != 1 || st.Calls[fake.OpStop] != 3 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestStartRejectsBadSpecs(t *testing.T) {
	p := fake.New(fake.Options{})
	for _, spec := range []provider.Spec{
		{Workdir: "relative"},
		{Workdir: "/../up"},
		{Files: map[string]string{"../../etc/passwd": "x"}},
	} {
		_, err := p.Start(context.Background(), spec)
		if !errors.Is(err, provider.ErrInvalidSpec) {
			t.Errorf("Start(%+v) = %v, want ErrInvalidSpec", spec, err)
		}
	}
	if n := p.Stats().LiveSandboxes; n != 0 {
		t.Fatalf("live = %d", n)
	}
}

func TestStatusStoppedUnknownAndForeign(t *testing.T) {
	ctx := context.Background()
	p := fake.New(fake.Options{})
	h := start(t, p, provider.Spec{})
	if err := p.Stop(ctx, h); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		h    provider.Handle
		want provider.Status
	}{
		{h, provider.StatusStopped},
		{provider.Handle{SandboxID: "sb-99"}, provider.StatusUnknown},
		{provider.Handle{SandboxID: "other"}, provider.StatusUnknown},
	} {
		st, err := p.Status(ctx, tc.h)
		if st != tc.want || !errors.Is(err, provider.ErrSandboxNotFound) {
			t.Errorf("Status(%v) = %q, %v; want %q, ErrSandboxNotFound", tc.h, st, err, tc.want)
		}
	}

	live := start(t, p, provider.Spec{})
	foreign := live
	foreign.Provider = "other"
	if err := p.Stop(ctx, foreign); !errors.Is(err, provider.ErrSandboxNotFound) {
		t.Fatalf("Stop(foreign) = %v", err)
	}
	if _, err := p.Exec(ctx, foreign, provider.ExecRequest{Command: "true"}); !errors.Is(err, provider.ErrSandboxNotFound) {
		t.Fatalf("Exec(foreign) = %v", err)
	}
	if _, ok := p.Sandbox(live.SandboxID); !ok {
		t.Fatal("foreign Stop stopped the sandbox")
	}
}

func TestUnknownSandbox(t *testing.T) {
	ctx := context.Background()
	p := fake.New(fake.Options{})
	h := provider.Handle{SandboxID: "sb-1", Provider: "fake"}
	checks := map[string]error{}
	_, checks["exec"] = p.Exec(ctx, h, provider.ExecRequest{Command: "pwd"})
	checks["write"] = p.WriteFile(ctx, h, "a", nil)
	_, checks["read"] = p.ReadFile(ctx, h, "a")
	_, checks["status"] = p.Status(ctx, h)
	_, checks["snapshot"] = p.Snapshot(ctx, h, "")
	checks["renew"] = p.Renew(ctx, h, t0)
	for op, err := range checks {
		if !errors.Is(err, provider.ErrSandboxNotFound) {
			t.Errorf("%s = %v, want ErrSandboxNotFound", op, err)
		}
	}
	if err := p.Stop(ctx, h); err != nil {
		t.Errorf("Stop = %v", err)
	}
	if _, err := p.Fork(ctx, provider.Spec{}, "snap-1"); !errors.Is(err, provider.ErrSnapshotNotFound) {
		t.Errorf("Fork = %v", err)
	}
	if err := p.DeleteSnapshot(ctx, "snap-1"); err != nil {
		t.Errorf("DeleteSnapshot = %v", err)
	}
	if n := p.Stats().Failures[fake.OpExec]; n != 1 {
		t.Errorf("exec failures = %d", n)
	}
}

func TestExec(t *testing.T) {
	ctx := context.Background()
	p := fake.New(fake.Options{})
	h := start(t, p, provider.Spec{Files: map[string]string{
		"a.txt":       "A\n",
		"b.txt":       "B\n",
		"dir/c.txt":   "C",
		"dir/d/e.txt": "E",
		"/etc/conf":   "conf",
	}})
	notSupported := func(name string) string {
		return "fake: command not supported: " + name + " (fake understands pwd, cat, ls, echo, true, false, exit, test -f)"
	}
	for _, tc := range []struct {
		cmd, cwd string
		want     provider.ExecResult
	}{
		{cmd: "pwd", want: provider.ExecResult{Stdout: "/workspace\n"}},
		{cmd: "pwd", cwd: "dir", want: provider.ExecResult{Stdout: "/workspace/dir\n"}},
		{cmd: "pwd", cwd: "/etc", want: provider.ExecResult{Stdout: "/etc\n"}},
		{cmd: "cat a.txt b.txt", want: provider.ExecResult{Stdout: "A\nB\n"}},
		{cmd: "cat c.txt", cwd: "dir", want: provider.ExecResult{Stdout: "C"}},
		{cmd: "cat ../a.txt", cwd: "dir", want: provider.ExecResult{Stdout: "A\n"}},
		{cmd: "cat missing a.txt", want: provider.ExecResult{Stdout: "A\n", Stderr: "cat: missing: No such file or directory\n", ExitCode: 1}},
		{cmd: "cat dir", want: provider.ExecResult{Stderr: "cat: dir: Is a directory\n", ExitCode: 1}},
		{cmd: "ls", want: provider.ExecResult{Stdout: "a.txt\nb.txt\ndir\n"}},
		{cmd: "ls dir", want: provider.ExecResult{Stdout: "c.txt\nd\n"}},
		{cmd: "ls /", want: provider.ExecResult{Stdout: "etc\nworkspace\n"}},
		{cmd: "ls a.txt", want: provider.ExecResult{Stdout: "a.txt\n"}},
		{cmd: "ls nope", want: provider.ExecResult{Stderr: "ls: cannot access 'nope': No such file or directory\n", ExitCode: 2}},
		{cmd: "echo hello   world", want: provider.ExecResult{Stdout: "hello world\n"}},
		{cmd: `echo 'single  "q"' "double  'q' \"x\""`, want: provider.ExecResult{Stdout: `single  "q" double  'q' "x"` + "\n"}},
		{cmd: "echo -n x", want: provider.ExecResult{Stdout: "x"}},
		{cmd: "echo '>' literal", want: provider.ExecResult{Stdout: "> literal\n"}},
		{cmd: "true", want: provider.ExecResult{}},
		{cmd: "false", want: provider.ExecResult{ExitCode: 1}},
		{cmd: "exit 3", want: provider.ExecResult{ExitCode: 3}},
		{cmd: "exit", want: provider.ExecResult{}},
		{cmd: "test -f a.txt", want: provider.ExecResult{}},
		{cmd: "test -f dir", want: provider.ExecResult{ExitCode: 1}},
		{cmd: "test -f nope", want: provider.ExecResult{ExitCode: 1}},
		{cmd: "", want: provider.ExecResult{}},
		{cmd: "python3 -c 'print(1)'", want: provider.ExecResult{Stderr: notSupported("python3"), ExitCode: 127}},
		{cmd: "cd dir", want: provider.ExecResult{Stderr: notSupported("cd"), ExitCode: 127}},
	} {
		got, err := p.Exec(ctx, h, provider.ExecRequest{Command: tc.cmd, Cwd: tc.cwd})
		if err != nil {
			t.Errorf("Exec(%q): %v", tc.cmd, err)
			continue
		}
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("Exec(%q, cwd %q) (-want +got):\n%s", tc.cmd, tc.cwd, d)
		}
	}

	for _, cmd := range []string{"cat a.txt | wc", "true && false", "echo $HOME", "echo *", "echo 'open", "echo >", "ls -la"} {
		got, err := p.Exec(ctx, h, provider.ExecRequest{Command: cmd})
		if err != nil || got.ExitCode != 2 || !strings.HasPrefix(got.Stderr, "fake: ") {
			t.Errorf("Exec(%q) = %+v, %v; want exit 2 with a fake: message", cmd, got, err)
		}
	}

	if _, err := p.Exec(ctx, h, provider.ExecRequest{Command: "pwd", Cwd: "../../.."}); !errors.Is(err, provider.ErrPathEscape) {
		t.Errorf("escaping cwd: %v", err)
	}
}

func TestExecRedirect(t *testing.T) {
	ctx := context.Background()
	p := fake.New(fake.Options{})
	h := start(t, p, provider.Spec{Workdir: "/w"})
	for _, cmd := range []string{"echo one > out.txt", "echo two >> out.txt", "echo three>>out.txt", "pwd >/w/pwd.txt", "echo x > sub/new"} {
		res, err := p.Exec(ctx, h, provider.ExecRequest{Command: cmd})
		if err != nil || res.ExitCode != 0 || res.Stdout != "" {
			t.Fatalf("Exec(%q) = %+v, %v", cmd, res, err)
		}
	}
	files, _ := p.Files(h.SandboxID)
	want := map[string]string{"/w/out.txt": "one\ntwo\nthree\n", "/w/pwd.txt": "/w\n", "/w/sub/new": "x\n"}
	if d := cmp.Diff(want, files); d != "" {
		t.Fatalf("files (-want +got):\n%s", d)
	}
	res, _ := p.Exec(ctx, h, provider.ExecRequest{Command: "echo x > ../../x"})
	if res.ExitCode != 1 || !strings.Contains(res.Stderr, "escapes") {
		t.Fatalf("escaping redirect = %+v", res)
	}
	res, _ = p.Exec(ctx, h, provider.ExecRequest{Command: "echo x > sub"})
	if res.ExitCode != 1 || !strings.Contains(res.Stderr, "Is a directory") {
		t.Fatalf("redirect to a directory = %+v", res)
	}
}

func TestFiles(t *testing.T) {
	ctx := context.Background()
	p := fake.New(fake.Options{})
	h := start(t, p, provider.Spec{Workdir: "/repo/"})
	if err := p.WriteFile(ctx, h, "src/main.go", []byte("package main")); err != nil {
		t.Fatal(err)
	}
	if err := p.WriteFile(ctx, h, "/tmp/x", []byte("x")); err != nil {
		t.Fatal(err)
	}
	got, err := p.ReadFile(ctx, h, "/repo/src/./main.go")
	if err != nil || string(got) != "package main" {
		t.Fatalf("ReadFile = %q, %v", got, err)
	}
	got[0] = 'X' // the caller's slice is its own
	if got, _ := p.ReadFile(ctx, h, "src/main.go"); string(got) != "package main" {
		t.Fatalf("ReadFile after mutating a result = %q", got)
	}
	if _, err := p.ReadFile(ctx, h, "nope"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	for _, bad := range []string{"../../x", "/../x", "a/../../../x"} {
		if err := p.WriteFile(ctx, h, bad, nil); !errors.Is(err, provider.ErrPathEscape) {
			t.Errorf("WriteFile(%q) = %v", bad, err)
		}
		if _, err := p.ReadFile(ctx, h, bad); !errors.Is(err, provider.ErrPathEscape) {
			t.Errorf("ReadFile(%q) = %v", bad, err)
		}
	}
	if err := p.WriteFile(ctx, h, "src", nil); err == nil {
		t.Error("WriteFile over a directory succeeded")
	}
	files, _ := p.Files(h.SandboxID)
	if d := cmp.Diff(map[string]string{"/repo/src/main.go": "package main", "/tmp/x": "x"}, files); d != "" {
		t.Fatalf("files (-want +got):\n%s", d)
	}
	if res, _ := p.Exec(ctx, h, provider.ExecRequest{Command: "pwd"}); res.Stdout != "/repo\n" {
		t.Fatalf("pwd = %q", res.Stdout)
	}
}

func TestSnapshotAndFork(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	p := fake.New(fake.Options{Clock: clk})
	orig := start(t, p, provider.Spec{Workdir: "/w", Files: map[string]string{"a": "1"}, Metadata: map[string]string{"session": "s"}})
	clk.Advance(time.Second)
	sid := snap(t, p, orig)
	if sid != "snap-1" {
		t.Fatalf("snapshot id = %q", sid)
	}
	wantInfo := provider.SnapshotInfo{ID: sid, Name: "n", SandboxID: orig.SandboxID, Metadata: map[string]string{"session": "s"}, CreatedAt: t0.Add(time.Second)}
	if info, _ := p.SnapshotInfo(sid); !cmp.Equal(wantInfo, info) {
		t.Fatalf("SnapshotInfo = %+v", info)
	}
	snaps, err := p.ListSnapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]provider.SnapshotInfo{wantInfo}, snaps); d != "" {
		t.Fatalf("ListSnapshots (-want +got):\n%s", d)
	}

	// Changes to the original after the snapshot do not reach it.
	if err := p.WriteFile(ctx, orig, "a", []byte("2")); err != nil {
		t.Fatal(err)
	}
	if files, _ := p.SnapshotFiles(sid); !cmp.Equal(map[string]string{"/w/a": "1"}, files) {
		t.Fatalf("snapshot files = %v", files)
	}

	fork, err := p.Fork(ctx, provider.Spec{Files: map[string]string{"b": "3"}, Metadata: map[string]string{"session": "fork"}}, sid)
	if err != nil {
		t.Fatal(err)
	}
	if res, _ := p.Exec(ctx, fork, provider.ExecRequest{Command: "pwd"}); res.Stdout != "/w\n" {
		t.Fatalf("fork workdir = %q, want the snapshot's", res.Stdout)
	}
	if files, _ := p.Files(fork.SandboxID); !cmp.Equal(map[string]string{"/w/a": "1"}, files) {
		t.Fatalf("fork files = %v", files)
	}
	info, _ := p.Sandbox(fork.SandboxID)
	if info.FromSnapshot != sid || info.Metadata["session"] != "fork" {
		t.Fatalf("fork info = %+v", info)
	}

	// The fork and the original are independent both ways; while the fork
	// stands, its snapshot cannot be deleted.
	if err := p.WriteFile(ctx, fork, "a", []byte("fork")); err != nil {
		t.Fatal(err)
	}
	if err := p.DeleteSnapshot(ctx, sid); !errors.Is(err, provider.ErrSnapshotInUse) {
		t.Fatalf("DeleteSnapshot under a live fork = %v, want ErrSnapshotInUse", err)
	}
	if _, ok := p.SnapshotInfo(sid); !ok {
		t.Fatal("a refused delete removed the snapshot")
	}
	if got, _ := p.ReadFile(ctx, orig, "a"); string(got) != "2" {
		t.Fatalf("original a = %q", got)
	}
	if got, _ := p.ReadFile(ctx, fork, "a"); string(got) != "fork" {
		t.Fatalf("fork a = %q", got)
	}
	other, err := p.Fork(ctx, provider.Spec{Workdir: "/other"}, snap(t, p, fork))
	if err != nil {
		t.Fatal(err)
	}
	if res, _ := p.Exec(ctx, other, provider.ExecRequest{Command: "cat /w/a"}); res.Stdout != "fork" {
		t.Fatalf("fork of fork = %+v", res)
	}
	if res, _ := p.Exec(ctx, other, provider.ExecRequest{Command: "pwd"}); res.Stdout != "/other\n" {
		t.Fatalf("explicit fork workdir = %q", res.Stdout)
	}
	// Once its fork is stopped, the snapshot goes.
	if err := p.Stop(ctx, fork); err != nil {
		t.Fatal(err)
	}
	if err := p.DeleteSnapshot(ctx, sid); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Fork(ctx, provider.Spec{}, sid); !errors.Is(err, provider.ErrSnapshotNotFound) {
		t.Fatalf("Fork of a deleted snapshot = %v", err)
	}
	st := p.Stats()
	if st.Started != 1 || st.Forked != 2 || st.LiveSnapshots != 1 || st.LiveSandboxes != 2 {
		t.Fatalf("stats = %+v", st)
	}
}

// A fork whose lease ran out no longer stands on its snapshot.
func TestExpiredForkFreesItsSnapshot(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	p := fake.New(fake.Options{Clock: clk})
	sid := snap(t, p, start(t, p, provider.Spec{}))
	if _, err := p.Fork(ctx, provider.Spec{TTLSeconds: 60}, sid); err != nil {
		t.Fatal(err)
	}
	if err := p.DeleteSnapshot(ctx, sid); !errors.Is(err, provider.ErrSnapshotInUse) {
		t.Fatalf("DeleteSnapshot under a live fork = %v, want ErrSnapshotInUse", err)
	}
	clk.Advance(time.Minute)
	if err := p.DeleteSnapshot(ctx, sid); err != nil {
		t.Fatalf("DeleteSnapshot after its fork expired = %v", err)
	}
	if st := p.Stats(); st.LiveSnapshots != 0 || st.Reaped != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestFailNext(t *testing.T) {
	ctx := context.Background()
	p := fake.New(fake.Options{})
	p.FailNext(fake.OpStart, 2)
	for i := range 2 {
		_, err := p.Start(ctx, provider.Spec{})
		if !errors.Is(err, provider.ErrInjected) || !strings.Contains(err.Error(), "start") {
			t.Fatalf("Start %d = %v", i, err)
		}
	}
	a := start(t, p, provider.Spec{})
	b := start(t, p, provider.Spec{})
	if st := p.Stats(); st.LiveSandboxes != 2 || st.Failures[fake.OpStart] != 2 || st.Injected[fake.OpStart] != 2 {
		t.Fatalf("stats = %+v", st)
	}

	p.FailNextFor(fake.OpSnapshot, b.SandboxID, 1)
	if _, err := p.Snapshot(ctx, a, ""); err != nil {
		t.Fatalf("snapshot of a: %v", err)
	}
	_, err := p.Snapshot(ctx, b, "")
	if !errors.Is(err, provider.ErrInjected) || !strings.Contains(err.Error(), b.SandboxID) {
		t.Fatalf("snapshot of b = %v", err)
	}
	sid := snap(t, p, b)

	// For Fork, the id may name the sandbox the snapshot came from.
	p.FailNextFor(fake.OpFork, b.SandboxID, 1)
	if _, err := p.Fork(ctx, provider.Spec{}, sid); !errors.Is(err, provider.ErrInjected) {
		t.Fatalf("fork = %v", err)
	}
	if _, err := p.Fork(ctx, provider.Spec{}, sid); err != nil {
		t.Fatalf("second fork: %v", err)
	}

	p.FailNext(fake.OpStop, 1)
	if err := p.Stop(ctx, a); !errors.Is(err, provider.ErrInjected) {
		t.Fatalf("Stop = %v", err)
	}
	if _, ok := p.Sandbox(a.SandboxID); !ok {
		t.Fatal("a failed-before Stop stopped the sandbox")
	}

	p.FailNext(fake.OpExec, 5)
	p.FailNextFor(fake.OpExec, a.SandboxID, 5)
	p.ClearFaults()
	if _, err := p.Exec(ctx, a, provider.ExecRequest{Command: "true"}); err != nil {
		t.Fatalf("Exec after ClearFaults: %v", err)
	}
}

func TestFailWithProbabilityIsDeterministic(t *testing.T) {
	outcomes := func(seed int64) []bool {
		p := fake.New(fake.Options{Seed: seed})
		h := start(t, p, provider.Spec{})
		p.FailWithProbability(fake.OpExec, 0.5)
		var out []bool
		for range 64 {
			_, err := p.Exec(context.Background(), h, provider.ExecRequest{Command: "true"})
			if err != nil && !errors.Is(err, provider.ErrInjected) {
				t.Fatal(err)
			}
			out = append(out, err != nil)
		}
		return out
	}
	a, b := outcomes(42), outcomes(42)
	if d := cmp.Diff(a, b); d != "" {
		t.Fatalf("same seed, different faults:\n%s", d)
	}
	failed := 0
	for _, f := range a {
		if f {
			failed++
		}
	}
	if failed == 0 || failed == len(a) {
		t.Fatalf("p=0.5 failed %d of %d", failed, len(a))
	}
	if cmp.Equal(a, outcomes(43)) {
		t.Fatal("different seeds gave the same 64 outcomes")
	}
}

func TestFailAfterEffect(t *testing.T) {
	ctx := context.Background()
	p := fake.New(fake.Options{})
	p.FailAfterEffect(fake.OpStart, 1)
	if h, err := p.Start(ctx, provider.Spec{}); !errors.Is(err, provider.ErrInjected) || h.SandboxID != "" {
		t.Fatalf("Start = %v, %v", h, err)
	}
	if d := cmp.Diff([]string{"sb-1"}, p.LiveSandboxIDs()); d != "" {
		t.Fatalf("the sandbox the failed Start made should exist (-want +got):\n%s", d)
	}

	h := start(t, p, provider.Spec{})
	p.FailAfterEffect(fake.OpSnapshot, 1)
	id, err := p.Snapshot(ctx, h, "x")
	if !errors.Is(err, provider.ErrInjected) || id != "" {
		t.Fatalf("Snapshot = %q, %v", id, err)
	}
	if d := cmp.Diff([]string{"snap-1"}, p.SnapshotIDs()); d != "" {
		t.Fatalf("the snapshot should exist (-want +got):\n%s", d)
	}
	if !strings.Contains(err.Error(), "snap-1") {
		t.Fatalf("error should name the snapshot it made: %v", err)
	}

	p.FailAfterEffect(fake.OpFork, 1)
	if _, err := p.Fork(ctx, provider.Spec{}, "snap-1"); !errors.Is(err, provider.ErrInjected) {
		t.Fatalf("Fork = %v", err)
	}
	p.FailAfterEffect(fake.OpStop, 1)
	if err := p.Stop(ctx, h); !errors.Is(err, provider.ErrInjected) {
		t.Fatalf("Stop = %v", err)
	}
	if d := cmp.Diff([]string{"sb-1", "sb-3"}, p.LiveSandboxIDs()); d != "" {
		t.Fatalf("fork exists, h stopped (-want +got):\n%s", d)
	}
	if st := p.Stats(); st.Started != 2 || st.Forked != 1 || st.Stopped != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestHangNext(t *testing.T) {
	p := fake.New(fake.Options{})
	h := start(t, p, provider.Spec{})
	p.HangNext(fake.OpSnapshot, 1)
	began := make(chan struct{}, 1)
	p.SetHook(func(c fake.Call) {
		if c.Op == fake.OpSnapshot && c.Phase == fake.PhaseBegin {
			began <- struct{}{}
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := p.Snapshot(ctx, h, "")
		done <- err
	}()
	<-began
	select {
	case err := <-done:
		t.Fatalf("hung Snapshot returned before cancel: %v", err)
	default:
	}
	if n := p.Stats().InFlight[fake.OpSnapshot]; n != 1 {
		t.Fatalf("in flight = %d", n)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Snapshot = %v", err)
	}
	if ids := p.SnapshotIDs(); len(ids) != 0 {
		t.Fatalf("hung Snapshot had an effect: %v", ids)
	}
	// Only one call hangs.
	if _, err := p.Snapshot(context.Background(), h, ""); err != nil {
		t.Fatal(err)
	}
}

func TestLatencyHonoursContext(t *testing.T) {
	p := fake.New(fake.Options{})
	h := start(t, p, provider.Spec{})
	p.SetLatency(fake.OpExec, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	// Cancel once the call has begun, so the wait must notice it.
	p.SetHook(func(c fake.Call) {
		if c.Op == fake.OpExec && c.Phase == fake.PhaseBegin {
			cancel()
		}
	})
	if _, err := p.Exec(ctx, h, provider.ExecRequest{Command: "echo x > f"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Exec = %v", err)
	}
	if files, _ := p.Files(h.SandboxID); len(files) != 0 {
		t.Fatalf("cancelled Exec had an effect: %v", files)
	}
	p.SetHook(nil)

	const d = 20 * time.Millisecond
	p.SetLatency(fake.OpStatus, d)
	began := time.Now()
	if _, err := p.Status(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(began); el < d {
		t.Fatalf("Status took %v, want at least %v", el, d)
	}
	p.SetLatencyRange(fake.OpStatus, d, 2*d)
	began = time.Now()
	if _, err := p.Status(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(began); el < d {
		t.Fatalf("Status took %v, want at least %v", el, d)
	}
}

func TestLeases(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(t0)
	p := fake.New(fake.Options{Clock: clk})
	h := start(t, p, provider.Spec{TTLSeconds: 10})
	forever := start(t, p, provider.Spec{})
	if info, _ := p.Sandbox(h.SandboxID); !info.ExpiresAt.Equal(t0.Add(10 * time.Second)) {
		t.Fatalf("ExpiresAt = %v", info.ExpiresAt)
	}
	if info, _ := p.Sandbox(forever.SandboxID); !info.ExpiresAt.IsZero() {
		t.Fatalf("no-TTL ExpiresAt = %v", info.ExpiresAt)
	}

	clk.Advance(5 * time.Second)
	if err := p.Renew(ctx, h, clk.Now().Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	clk.Advance(9 * time.Second) // 14s: past the first expiry, before the renewed one
	if st, err := p.Status(ctx, h); err != nil || st != provider.StatusRunning {
		t.Fatalf("renewed Status = %q, %v", st, err)
	}
	clk.Advance(time.Second) // 15s: exactly the renewed expiry
	if st, err := p.Status(ctx, h); !errors.Is(err, provider.ErrSandboxNotFound) || st != provider.StatusStopped {
		t.Fatalf("expired Status = %q, %v", st, err)
	}
	if err := p.Renew(ctx, h, clk.Now().Add(time.Hour)); !errors.Is(err, provider.ErrSandboxNotFound) {
		t.Fatalf("Renew of expired = %v", err)
	}
	if st := p.Stats(); st.Reaped != 1 || st.LiveSandboxes != 1 {
		t.Fatalf("stats = %+v", st)
	}

	a := start(t, p, provider.Spec{TTLSeconds: 1})
	b := start(t, p, provider.Spec{TTLSeconds: 2})
	c := start(t, p, provider.Spec{TTLSeconds: 60})
	clk.Advance(2 * time.Second)
	if d := cmp.Diff([]string{a.SandboxID, b.SandboxID}, p.Reap()); d != "" {
		t.Fatalf("Reap (-want +got):\n%s", d)
	}
	if got := p.Reap(); len(got) != 0 {
		t.Fatalf("second Reap = %v", got)
	}
	clk.Advance(time.Minute)
	list, err := p.ListSandboxes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Handle.SandboxID != forever.SandboxID {
		t.Fatalf("ListSandboxes = %+v", list)
	}
	if _, ok := p.Files(c.SandboxID); ok {
		t.Fatal("expired sandbox still has files")
	}
	if err := p.Stop(ctx, c); err != nil {
		t.Fatalf("Stop of expired = %v", err)
	}
	if st := p.Stats(); st.Reaped != 4 || st.Stopped != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestPeakConcurrency(t *testing.T) {
	const n = 5
	p := fake.New(fake.Options{})
	var handles []provider.Handle
	for range n {
		handles = append(handles, start(t, p, provider.Spec{}))
	}
	entered, release := make(chan struct{}), make(chan struct{})
	p.SetHook(func(c fake.Call) {
		if c.Op == fake.OpSnapshot && c.Phase == fake.PhaseBegin {
			entered <- struct{}{}
			<-release
		}
	})
	var wg sync.WaitGroup
	for _, h := range handles {
		wg.Go(func() {
			if _, err := p.Snapshot(context.Background(), h, ""); err != nil {
				t.Error(err)
			}
		})
	}
	for range n {
		<-entered
	}
	st := p.Stats()
	if st.InFlight[fake.OpSnapshot] != n || st.Peak[fake.OpSnapshot] != n || p.PeakTotal() != n {
		t.Fatalf("with %d held: in flight %d, peak %d, peak total %d", n, st.InFlight[fake.OpSnapshot], st.Peak[fake.OpSnapshot], p.PeakTotal())
	}
	close(release)
	wg.Wait()
	st = p.Stats()
	if st.InFlight[fake.OpSnapshot] != 0 || st.Peak[fake.OpSnapshot] != n || st.Peak[fake.OpStart] != 1 || st.LiveSnapshots != n {
		t.Fatalf("after: %+v", st)
	}
}

func TestHookSeesIDs(t *testing.T) {
	p := fake.New(fake.Options{})
	var calls []fake.Call
	p.SetHook(func(c fake.Call) { calls = append(calls, c) })
	h := start(t, p, provider.Spec{})
	sid := snap(t, p, h)
	p.FailNext(fake.OpStop, 1)
	stopErr := p.Stop(context.Background(), h)
	want := []fake.Call{
		{Op: fake.OpStart, Phase: fake.PhaseBegin},
		{Op: fake.OpStart, SandboxID: "sb-1", Phase: fake.PhaseEnd},
		{Op: fake.OpSnapshot, SandboxID: "sb-1", Phase: fake.PhaseBegin},
		{Op: fake.OpSnapshot, SandboxID: "sb-1", SnapshotID: sid, Phase: fake.PhaseEnd},
		{Op: fake.OpStop, SandboxID: "sb-1", Phase: fake.PhaseBegin},
		{Op: fake.OpStop, SandboxID: "sb-1", Phase: fake.PhaseEnd, Err: stopErr},
	}
	if d := cmp.Diff(want, calls, cmp.Comparer(func(a, b error) bool { return a == b })); d != "" {
		t.Fatalf("hook calls (-want +got):\n%s", d)
	}
}

func TestNoSnapshots(t *testing.T) {
	ns := fake.NewWithoutSnapshots(fake.Options{Name: "plain"})
	caps := ns.Capabilities().Flags()
	if d := cmp.Diff(provider.Flags{List: true}, caps); d != "" {
		t.Fatalf("capabilities (-want +got):\n%s", d)
	}
	if d := cmp.Diff(provider.Flags{Snapshot: true, Lease: true, List: true}, fake.New(fake.Options{}).Capabilities().Flags()); d != "" {
		t.Fatalf("full fake capabilities (-want +got):\n%s", d)
	}
	ctx := context.Background()
	h := start(t, ns, provider.Spec{Files: map[string]string{"f": "x"}})
	if h.Provider != "plain" || ns.Name() != "plain" {
		t.Fatalf("handle = %v", h)
	}
	ns.Fake().FailNext(fake.OpExec, 1)
	if _, err := ns.Exec(ctx, h, provider.ExecRequest{Command: "cat f"}); !errors.Is(err, provider.ErrInjected) {
		t.Fatalf("Exec = %v", err)
	}
	res, err := ns.Exec(ctx, h, provider.ExecRequest{Command: "cat f"})
	if err != nil || res.Stdout != "x" {
		t.Fatalf("Exec = %+v, %v", res, err)
	}
	if err := ns.WriteFile(ctx, h, "g", []byte("y")); err != nil {
		t.Fatal(err)
	}
	if got, err := ns.ReadFile(ctx, h, "g"); err != nil || string(got) != "y" {
		t.Fatalf("ReadFile = %q, %v", got, err)
	}
	if st, err := ns.Status(ctx, h); err != nil || st != provider.StatusRunning {
		t.Fatalf("Status = %q, %v", st, err)
	}
	if l, err := ns.ListSandboxes(ctx); err != nil || len(l) != 1 {
		t.Fatalf("ListSandboxes = %v, %v", l, err)
	}
	if l, err := ns.ListSnapshots(ctx); err != nil || len(l) != 0 {
		t.Fatalf("ListSnapshots = %v, %v", l, err)
	}
	if err := ns.Stop(ctx, h); err != nil {
		t.Fatal(err)
	}
	if n := ns.Fake().Stats().LiveSandboxes; n != 0 {
		t.Fatalf("live = %d", n)
	}
}

// TestConcurrentStress drives every op from many goroutines with random
// faults and latency, for the race detector, and then checks that the
// counters add up.
func TestConcurrentStress(t *testing.T) {
	clk := clock.NewManual(t0)
	p := fake.New(fake.Options{Clock: clk, Seed: 7})
	for _, op := range []fake.Op{fake.OpStart, fake.OpExec, fake.OpSnapshot, fake.OpFork, fake.OpStop} {
		p.FailWithProbability(op, 0.1)
		p.SetLatencyRange(op, 0, 50*time.Microsecond)
	}
	p.FailAfterEffect(fake.OpSnapshot, 20)
	p.SetHook(func(fake.Call) {})
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 32 {
		wg.Go(func() {
			for i := range 40 {
				h, err := p.Start(ctx, provider.Spec{TTLSeconds: float64(1 + (w+i)%5), Files: map[string]string{"f": "x"}})
				if err != nil {
					continue
				}
				_ = p.WriteFile(ctx, h, fmt.Sprintf("w%d", i), []byte("y"))
				_, _ = p.Exec(ctx, h, provider.ExecRequest{Command: "cat f > g"})
				if id, err := p.Snapshot(ctx, h, ""); err == nil {
					if f, err := p.Fork(ctx, provider.Spec{}, id); err == nil {
						_ = p.Renew(ctx, f, clk.Now().Add(time.Second))
						_ = p.Stop(ctx, f)
					}
					if i%2 == 0 {
						_ = p.DeleteSnapshot(ctx, id)
					}
				}
				if i%3 == 0 {
					_ = p.Stop(ctx, h)
				}
				if i%7 == 0 {
					clk.Advance(time.Second)
					p.Reap()
					_, _ = p.ListSandboxes(ctx)
				}
				_ = p.Stats()
			}
		})
	}
	wg.Wait()
	st := p.Stats()
	if got := st.Started + st.Forked - st.Stopped - st.Reaped; got != st.LiveSandboxes {
		t.Fatalf("started %d + forked %d - stopped %d - reaped %d = %d, live %d",
			st.Started, st.Forked, st.Stopped, st.Reaped, got, st.LiveSandboxes)
	}
	if len(p.LiveSandboxIDs()) != st.LiveSandboxes || len(p.SnapshotIDs()) != st.LiveSnapshots {
		t.Fatalf("ids disagree with stats %+v", st)
	}
	// A snapshot a live fork stands on was never deleted, however the
	// deletes and forks interleaved.
	snaps := map[string]bool{}
	for _, id := range p.SnapshotIDs() {
		snaps[id] = true
	}
	for _, id := range p.LiveSandboxIDs() {
		if info, ok := p.Sandbox(id); ok && info.FromSnapshot != "" && !snaps[info.FromSnapshot] {
			t.Errorf("sandbox %s stands on snapshot %s, which was deleted", id, info.FromSnapshot)
		}
	}
	for op, n := range st.InFlight {
		if n != 0 {
			t.Errorf("%s still in flight: %d", op, n)
		}
	}
	if st.Calls[fake.OpStart] != 32*40 || st.Injected[fake.OpStart] == 0 {
		t.Fatalf("start calls %d, injected %d", st.Calls[fake.OpStart], st.Injected[fake.OpStart])
	}
}
