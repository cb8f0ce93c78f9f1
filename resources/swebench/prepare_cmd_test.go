package swebench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxowner/owner/app"
	"github.com/sandboxowner/owner/resources/swebench"
)

// TestThePrepareCommandBuildsAndValidatesADataset runs `server swebench
// prepare` on a dataset of two instances of the task repository: one whose
// lists are right, one whose PASS_TO_PASS names a test that does not exist.
func TestThePrepareCommandBuildsAndValidatesADataset(t *testing.T) {
	t.Parallel()
	tr := swebench.NewTaskRepo(t)
	config := childConfig(t, tr, t.TempDir(), t.TempDir())
	broken := map[string]any{}
	for k, v := range tr.Row {
		broken[k] = v
	}
	broken["instance_id"] = "example__calc-2"
	broken["PASS_TO_PASS"] = `["TestAdd", "TestNoSuchTest"]`
	var rows bytes.Buffer
	for _, r := range []map[string]any{tr.Row, broken} {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		rows.Write(append(b, '\n'))
	}
	dataset := filepath.Join(t.TempDir(), "rows.jsonl")
	if err := os.WriteFile(dataset, rows.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := app.Run(context.Background(), []string{"swebench", "prepare", "-config", config, "-dataset", dataset, "-parallel", "2", "-log-level", "warn"}, &stdout, &stderr)
	if code != 1 {
		t.Fatalf("exit %d, want 1 (one instance is not ready)\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	lines := strings.Split(strings.TrimRight(stdout.String(), "\n"), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "INSTANCE") {
		t.Fatalf("table:\n%s", stdout.String())
	}
	ok, bad := strings.Fields(lines[1]), strings.Fields(lines[2])
	if ok[0] != "example__calc-1" || ok[1] != "ok" || ok[2] != "available" {
		t.Errorf("the good instance: %q", lines[1])
	}
	if bad[0] != "example__calc-2" || bad[1] != "ok" || bad[2] != "unavailable" || !strings.Contains(lines[2], "TestNoSuchTest") || !strings.Contains(lines[2], "test output:") {
		t.Errorf("the broken instance: %q", lines[2])
	}
	if !strings.Contains(stderr.String(), "[==============================] 2/2") {
		t.Errorf("no finished progress bar on stderr:\n%s", stderr.String())
	}
	// Bad arguments are exit 2 and say why.
	for _, args := range [][]string{{"swebench"}, {"swebench", "prepare", "-config", config}, {"swebench", "prepare", "-dataset", "/nonexistent/rows.jsonl", "-config", config}, {"swebench", "prepare", "-parallel", "0"}} {
		stderr.Reset()
		if code := app.Run(context.Background(), args, &stdout, &stderr); code != 2 || stderr.Len() == 0 {
			t.Errorf("%q: exit %d, stderr %q", args, code, stderr.String())
		}
	}
}
