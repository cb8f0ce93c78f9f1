// Package grading holds the SWE-bench grader's decisions, pure functions of
// text: which files of a model patch are outside the agent's remit (Guard),
// which added code ends the test binary before its tests (ExitingInits),
// what a test log says (ParseLog for the row's parser, ParseGoTestFraming
// for a Go test binary's own framing, marked by toolchains since Go 1.20),
// which claims were forged (GoTestFraming.Forged), and the verdict
// (Resolve, Decide). Package swebench runs the sandboxes and hands their
// output here; keeping the decisions apart lets their tests, and mutation
// testing, run in seconds.
package grading
