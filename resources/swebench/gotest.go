package swebench

// goExecWrapper is given to go test as -exec (through GOFLAGS): it runs
// each test binary with -test.v=test2json, after the go command's own
// -test.v, so that the testing package marks its framing; any other program
// (go run's) runs as is.
const goExecWrapper = `#!/bin/sh
case "$1" in
*.test) exec "$@" -test.v=test2json ;;
esac
exec "$@"
`
