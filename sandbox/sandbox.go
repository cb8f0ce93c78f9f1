// Package sandbox holds what every layer means by a session's sandbox: the
// Sandbox a session holds, the setup and operations run against it, the
// Fate of one the owner held, and ErrNone, the one error for a session that
// holds none (and the other errors of its calls). It sits below the actors
// so that the actors, the owner, the transports and the resources servers
// share these names instead of aliasing each other's.
package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/sandboxowner/owner/provider"
)

// Sandbox is what a session holds: the handle of its sandbox, the spec it was
// started (or forked) from, its workdir and the session data its setup
// returned.
type Sandbox struct {
	Handle  provider.Handle
	Spec    provider.Spec
	Workdir string
	// Data is the setup's JSON object; never nil once installed ("{}").
	Data json.RawMessage
	// Restored is true when the sandbox is a fork a restore installed.
	Restored bool
	// FromSnapshot is the snapshot the sandbox was forked from, if any.
	FromSnapshot string
	// ExpiresAt is the lease the owner last set; zero without one.
	ExpiresAt time.Time
}

// SetupFunc runs a resources server's setup against a freshly started
// sandbox. It returns the session data (a JSON object, or nil for {}).
type SetupFunc func(ctx context.Context, p provider.Provider, sb Sandbox) (json.RawMessage, error)

// Launched is a sandbox a LaunchFunc made: its handle, the snapshot it was
// forked from ("" for none), its workdir when the launch knows it (a
// template's) and when its lease began (zero: now).
type Launched struct {
	Handle       provider.Handle
	FromSnapshot string
	Workdir      string
	StartedAt    time.Time
}

// LaunchFunc makes a session's sandbox in place of the provider's Start
// (the owner's fork of a template, or a claim on a warm pool).
type LaunchFunc func(ctx context.Context, spec provider.Spec) (Launched, error)

// DoFunc is one operation on a session's sandbox (a tool call, a patch
// extraction), serialised with the session's other operations.
type DoFunc func(ctx context.Context, p provider.Provider, sb Sandbox) error

// Errors a session's sandbox calls answer, for every layer to branch on.
var (
	// ErrNone: the session holds no sandbox (never seeded, ended, or its
	// start failed). The transports answer it 409 no_session_sandbox; a
	// verify that gets it must never grade.
	ErrNone = errors.New("no session sandbox")
	// ErrExists: the session already has a sandbox (or one is starting).
	ErrExists = errors.New("session already has a sandbox")
	// ErrLost: the session's sandbox is gone behind the owner's back
	// (stopped out of band, its lease lost, unknown to the provider): its
	// calls and its verify are refused (HTTP 409 sandbox_lost), never
	// graded, and no checkpoint exports it. Ending the session still works.
	ErrLost = errors.New("the session's sandbox was lost")
	// ErrSetup wraps every failure of a session's setup; nothing of the
	// session is tracked after it.
	ErrSetup = errors.New("session setup failed")
	// ErrAtCapacity: the owner holds as many sessions as it may; a seed
	// starts nothing (HTTP 503 at_capacity). A restore is not bounded.
	ErrAtCapacity = errors.New("at capacity")
)

// Fate is what became of a sandbox a session held: the owner remembers it,
// and the sandbox API answers an agent's stale sandbox id by it.
type Fate string

// Fates.
const (
	// FateUnknown: no session held the sandbox (or it was forgotten).
	FateUnknown Fate = "unknown"
	// FateLive: the sandbox is its session's current one.
	FateLive Fate = "live"
	// FateSuperseded: a restore replaced it with a fork.
	FateSuperseded Fate = "superseded"
	// FateEnded: its session ended.
	FateEnded Fate = "ended"
)
