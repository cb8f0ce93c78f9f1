//go:build race

package sandboxapi

// raceEnabled: built with -race, whose sync.Pool drops items at random (the
// MAC's pooled state is then made again), so allocation counts vary.
const raceEnabled = true
