package conformance_test

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite docs/conformance.md from the statements")

const tablePath = "../docs/conformance.md"

// table renders docs/conformance.md from the statements.
func table() string {
	var b strings.Builder
	pass, by, na := 0, 0, 0
	for _, st := range statements {
		switch {
		case st.check != nil:
			pass++
		case st.na != "":
			na++
		default:
			by++
		}
	}
	b.WriteString("# Conformance to NeMo Gym's sandbox-owner protocol\n\n")
	b.WriteString("Generated from `conformance/statements_test.go` by `go test ./conformance -run TestTable -rewrite`;\n")
	b.WriteString("`go test ./conformance` runs every check against the server binary (`cmd/server`, notes, local provider)\n")
	b.WriteString("and fails if this file is not what the statements give. Sections are those of the protocol reference\n")
	b.WriteString("(`nemo-gym-protocol.md`) and its addendum. Where the project's own decisions and the reference disagree the project wins, and\n")
	b.WriteString("where the reference only infers the project wins; the notes say so.\n\n")
	fmt.Fprintf(&b, "%d statements: %d pass against the binary, %d are checked by another package's tests, %d do not apply.\n\n", len(statements), pass, by, na)
	b.WriteString("| test | section | statement | status | notes |\n|---|---|---|---|---|\n")
	esc := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	for _, st := range statements {
		status := "pass"
		switch {
		case st.check != nil:
		case st.na != "":
			status = "does not apply: " + st.na
		default:
			status = "checked by " + st.by
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", st.name, st.section, esc(st.text), esc(status), esc(st.note))
	}
	return b.String()
}

func TestTable(t *testing.T) {
	want := table()
	if *rewrite {
		if err := os.WriteFile(tablePath, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(tablePath)
	if err != nil || string(got) != want {
		t.Fatalf("%s is not what the statements give (go test ./conformance -run TestTable -rewrite): %v", tablePath, err)
	}
}
