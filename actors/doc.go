// Package actors holds the owner's two actors: the session actor (one per
// agent session) and the checkpoint coordinator.
//
// Each is split in two. The logic is plain Go state that takes one input and
// returns the effects to perform (Session.Step, Round): no I/O, no clock, no
// goroutines, so it is tested as a script of inputs and expected effects. The
// actor shell around it performs the effects: provider calls run on their own
// goroutines, never on the mailbox, and their outcomes come back to the actor
// as messages carrying the operation's sequence number, so a late or
// duplicate outcome is recognised and dropped.
//
// A session serialises its operations (start, tool calls, snapshots, stops):
// a stop never races its own start and a snapshot never runs during a tool
// call. Requests that only read state (GetSandbox), and snapshot requests to
// a session with nothing to export, are answered at once. What GetSandbox
// answers is also published, an immutable value swapped after each change
// (messages.SessionView), so that the owner's per-request reads need no
// message at all; every change still goes through the mailbox.
//
// The coordinator runs one snapshot round at a time: it asks every session,
// watches each one, and gives up on the stragglers at the round's deadline.
// Errors, stopped sessions and the deadline all count as failure; the owner
// commits the index only when none failed.
package actors
