#!/usr/bin/env bash
# A minimal SWE-bench row that runs here, offline: a tiny Go module whose Abs
# is wrong for negative numbers, the fix as the row's patch and the fix's
# tests as its test_patch, in SWE-bench's original row format.
# Creates: ./swebench/repos/calc (a git repository: the base commit, then the
# fix) and ./row.json, under the directory it runs in (the repository root).
# Needs git and jq.
#   examples/swebench-minimal/make-row.sh
set -euo pipefail
root=$(pwd)
repo=$root/swebench/repos/calc
rm -rf "$repo"
mkdir -p "$repo"
cd "$repo"
g() { git -c user.name=example -c user.email=example@example.com "$@"; }
g init -q -b main

cat > go.mod <<'GO'
module example.com/calc

go 1.22
GO
cat > calc.go <<'GO'
package calc

// Abs returns the absolute value of x.
func Abs(x int) int {
	if x < 0 {
		return x
	}
	return x
}

// Add returns a+b.
func Add(a, b int) int { return a + b }
GO
cat > calc_test.go <<'GO'
package calc

import "testing"

func TestAdd(t *testing.T) {
	if Add(2, 3) != 5 {
		t.Fatal("Add(2, 3)")
	}
}
GO
g add -A
g commit -q -m "Add calc"
base=$(git rev-parse HEAD)

cat > calc.go <<'GO'
package calc

// Abs returns the absolute value of x.
func Abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// Add returns a+b.
func Add(a, b int) int { return a + b }
GO
cat > abs_test.go <<'GO'
package calc

import "testing"

func TestAbs(t *testing.T) {
	t.Run("positive", func(t *testing.T) {
		if Abs(3) != 3 {
			t.Fatal("Abs(3)")
		}
	})
	t.Run("negative", func(t *testing.T) {
		if got := Abs(-3); got != 3 {
			t.Fatalf("Abs(-3) = %d", got)
		}
	})
}
GO
g add -A
g commit -q -m "Fix Abs for negative numbers"
fix=$(git rev-parse HEAD)

jq -n -c \
  --arg base "$base" \
  --arg patch "$(git diff "$base" "$fix" -- calc.go)"$'\n' \
  --arg test_patch "$(git diff "$base" "$fix" -- abs_test.go)"$'\n' \
  '{instance_id: "example__calc-1", repo: "example/calc", base_commit: $base,
    patch: $patch, test_patch: $test_patch,
    problem_statement: "Abs(-3) returns -3",
    FAIL_TO_PASS: ["TestAbs", "TestAbs/negative"], PASS_TO_PASS: ["TestAbs/positive", "TestAdd"]}' \
  > "$root/row.json"
echo "wrote $root/row.json (instance example__calc-1, base $base) and the repository $repo"
