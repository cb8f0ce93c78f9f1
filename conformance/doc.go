// Package conformance checks the server binary against the statements of
// NeMo Gym's sandbox-owner protocol that apply to it, one test per
// statement (conformance_test.go), and generates docs/conformance.md from
// them: each statement's section, what it says, and whether the binary
// conforms or why the statement does not apply. The package has no code
// of its own: `go test ./conformance` builds cmd/server and runs it.
package conformance
