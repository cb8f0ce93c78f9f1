//go:build !race

package sandboxapi

const raceEnabled = false
