//go:build race

// Package racebuild says whether the binary was built with -race, whose
// sync.Pool drops items at random: a test that counts allocations of code
// drawing on a pool (encoding/json's scanners, a MAC's pooled state) cannot
// count them in such a build.
package racebuild

// Enabled is true in a -race build.
const Enabled = true
