// Package gymcheck validates replies the way Gym's Python side does, for
// tests: it runs the machine's python3 with pydantic on Gym's models.
package gymcheck

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"os/exec"
	"testing"
)

//go:embed verify_models.py
var verifyModels string

// Python skips t, saying why, unless python3 with pydantic v2 runs here.
func Python(t testing.TB) {
	t.Helper()
	out, err := exec.Command("python3", "-c", "import pydantic, sys; sys.exit(0 if pydantic.VERSION.startswith('2') else 1)").CombinedOutput()
	if err != nil {
		t.Skipf("SKIP: python3 with pydantic v2 is not installed (CI installs python3-pydantic): %v %s", err, bytes.TrimSpace(out))
	}
}

// Verify fails t unless reply validates as Gym's verify response model
// ("base", "notes" or "swebench") and carries every field of request back.
func Verify(t testing.TB, model string, request, reply []byte) {
	t.Helper()
	Python(t)
	in, err := json.Marshal(map[string]any{"model": model, "request": json.RawMessage(request), "reply": json.RawMessage(reply)})
	if err != nil {
		t.Fatalf("gymcheck: %v", err)
	}
	cmd := exec.Command("python3", "-c", verifyModels)
	cmd.Stdin = bytes.NewReader(in)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("Gym's %s verify model refuses the reply: %v\n%s\nreply: %s", model, err, out, reply)
	}
}
