// Package sched is the seam through which the owner runs concurrent work
// and waits for it: the real runtime runs goroutines and lets its callers
// block; Det runs everything one step at a time on virtual time, each
// choice drawn from a seed, so that a simulation replays a run exactly.
package sched

import "context"

// Runtime runs work concurrently with its caller and tells its caller when
// what it waits for is ready.
//
// Code written against it waits in two moves: Await(ctx, ready), then its
// usual select on the channels ready looked at. On the real runtime Await
// returns at once and the select blocks; on Det, Await hands the turn to
// other work until ready holds (or ctx ends), so the select that follows
// never blocks. ready must only look (len of a buffered channel, a closed
// channel, a counter), never take.
type Runtime interface {
	// Go runs fn concurrently with its caller.
	Go(fn func())
	// Await returns once ready reports true or ctx is done (at once on
	// the real runtime).
	Await(ctx context.Context, ready func() bool)
}

// Dispatcher is what a Runtime that also runs actors' mailboxes offers
// (protoactor's mailbox dispatcher).
type Dispatcher interface {
	Schedule(fn func())
	Throughput() int
}

// Real is the Go runtime: goroutines and blocking selects.
type Real struct{}

// Go starts fn on a goroutine.
func (Real) Go(fn func()) { go fn() }

// Await returns at once: the caller blocks in its own select.
func (Real) Await(context.Context, func() bool) {}

// Or returns rt, or Real when rt is nil.
func Or(rt Runtime) Runtime {
	if rt == nil {
		return Real{}
	}
	return rt
}

// Closed reports whether ch, a channel that is only ever closed (never sent
// on), is closed: for ready funcs over done channels.
func Closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
