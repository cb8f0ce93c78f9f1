// Package notes is the notes resources server, upstream's end-to-end example
// of a server that owns a sandbox per session: seed starts a sandbox whose
// setup writes a random token to .seed_token and keeps it as session data,
// POST /append_note appends a line to notes.txt, and /verify rewards 1.0 only
// when the file's lines equal expected_notes and the session data's token
// equals the sandbox's (so a restore that lost either rewards 0), then ends
// the session.
//
// Files are read and written through the provider's ReadFile and WriteFile
// inside owner.Do, which serialises a session's operations, so the server
// runs unchanged on the fake provider and on a real one.
package notes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"slices"
	"strings"
	"syscall"

	"github.com/sandboxowner/owner/problem"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/resources"
	"github.com/sandboxowner/owner/sandbox"
)

// Names inside the sandbox and of the server.
const (
	Kind      = "notes"
	Image     = "notes"
	NotesFile = "notes.txt"
	TokenFile = ".seed_token"
	// RouteAppend is the server's tool route.
	RouteAppend = "/append_note"
	// MaxLine bounds one note.
	MaxLine = 64 << 10
	// MaxNotesBytes bounds how much of notes.txt the server reads: a
	// larger file is graded 0 by verify and refused by append_note, so a
	// sandbox cannot make the server hold a file of any size.
	MaxNotesBytes = 4 << 20
	// maxTokenBytes bounds the read of .seed_token (the token is 32 bytes).
	maxTokenBytes = 4 << 10
)

// Options configure the server.
type Options struct {
	// Name is the config name (default "notes").
	Name string
	// Image is the sandboxes' image (default "notes").
	Image string
	// Workdir of the sandboxes; empty is the provider's default.
	Workdir string
	// TTLSeconds is the sandboxes' lease (0: none).
	TTLSeconds float64
}

// Server is the notes resources server; it implements resources.Resources.
type Server struct {
	opts Options
}

var _ resources.Resources = (*Server)(nil)

// New returns a notes server.
func New(opts Options) *Server {
	if opts.Name == "" {
		opts.Name = "notes"
	}
	if opts.Image == "" {
		opts.Image = Image
	}
	return &Server{opts: opts}
}

// Name is the config name.
func (s *Server) Name() string { return s.opts.Name }

// Kind is "notes".
func (s *Server) Kind() string { return Kind }

// LendsSandboxes is true: every session holds one.
func (s *Server) LendsSandboxes() bool { return true }

// VerifyReplayable is false: verify ends the session.
func (s *Server) VerifyReplayable() bool { return false }

// Tools is /append_note.
func (s *Server) Tools() map[string]resources.ToolFunc {
	return map[string]resources.ToolFunc{RouteAppend: s.appendNote}
}

// sessionData is what setup returns and seed answers.
type sessionData struct {
	SeedToken string `json:"seed_token"`
}

// ProbeSpec is a sandbox like a session's, for a startup that finds out
// whether its provider takes snapshots.
func (s *Server) ProbeSpec() provider.Spec { return s.spec() }

func (s *Server) spec() provider.Spec {
	return provider.Spec{Image: s.opts.Image, Workdir: s.opts.Workdir, TTLSeconds: s.opts.TTLSeconds}
}

// setup writes a fresh token into the sandbox and returns it as session
// data, {"seed_token":"<32 hex digits>"}: written straight into the one
// buffer the file's content is a part of, where encoding/json and a string
// of the token were five allocations on every seed.
func setup(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) (json.RawMessage, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("seed token: %w", err)
	}
	const open, end = `{"seed_token":"`, `"}`
	data := make([]byte, 0, len(open)+hex.EncodedLen(len(b))+len(end))
	data = hex.AppendEncode(append(data, open...), b[:])
	tok := data[len(open):len(data):len(data)] // capped: a provider appending to it cannot reach the rest
	if err := p.WriteFile(ctx, sb.Handle, TokenFile, tok); err != nil {
		return nil, fmt.Errorf("write %s: %w", TokenFile, err)
	}
	return append(data, end...), nil
}

// Seed starts the session's sandbox; the row is not needed. A session that
// already has one (a repeated seed, or a restored session's re-seed) gets
// its session data back without a second sandbox or a second setup.
func (s *Server) Seed(ctx context.Context, sess *resources.Session, _ []byte) (any, error) {
	sb, err := sess.Owner.StartSessionSandbox(ctx, sess.ID, s.spec(), setup, s.opts.Workdir)
	if errors.Is(err, sandbox.ErrExists) {
		sb, err = sess.Owner.RequireSessionSandbox(ctx, sess.ID)
	}
	if err != nil {
		return nil, err
	}
	if sb.Restored {
		sess.Log.WithField("sandbox_id", sb.Handle.SandboxID).Info("re-seed of a restored session: the fork")
	}
	return json.RawMessage(sb.Data), nil
}

type appendRequest struct {
	Line *string `json:"line"`
}

func (s *Server) appendNote(ctx context.Context, sess *resources.Session, body []byte) (any, error) {
	var req appendRequest
	if err := resources.DecodeData(body, &req); err != nil {
		return nil, err
	}
	if req.Line == nil {
		return nil, resources.Invalid("line is required")
	}
	line := *req.Line
	if strings.ContainsAny(line, "\n\r") || len(line) > MaxLine {
		return nil, resources.Invalid("line must be one line of at most %d bytes", MaxLine)
	}
	err := sess.Owner.Do(ctx, sess.ID, func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) error {
		old, err := readOptional(ctx, p, sb.Handle, NotesFile, MaxNotesBytes-int64(len(line))-1)
		if unreadable(err) {
			return problem.Errorf(http.StatusConflict, CodeNotesUnreadable, "%s cannot take a note: %v", NotesFile, err)
		}
		if err != nil {
			return err
		}
		return p.WriteFile(ctx, sb.Handle, NotesFile, append(old, line+"\n"...))
	})
	if err != nil {
		return nil, err
	}
	return appended{}, nil
}

// appended is append_note's reply, {"success":true}, written without
// reflection: a map encoded through encoding/json was four of the route's
// allocations and a sort of its keys on every note.
type appended struct{}

const appendedJSON = `{"success":true}`

// AppendJSON writes the reply (the HTTP layer's way).
func (appended) AppendJSON(dst []byte) ([]byte, error) { return append(dst, appendedJSON...), nil }

// MarshalJSON is the reply for encoding/json (MCP's tool results).
func (appended) MarshalJSON() ([]byte, error) { return []byte(appendedJSON), nil }

// CodeNotesUnreadable is append_note's 409 code when notes.txt is not a
// regular file the server may read (a FIFO, a directory, a symlink) or
// would grow past MaxNotesBytes.
const CodeNotesUnreadable = "notes_unreadable"

// readOptional reads at most limit bytes of a file, a missing one as empty.
func readOptional(ctx context.Context, p provider.Provider, h provider.Handle, path string, limit int64) ([]byte, error) {
	b, err := provider.ReadFileAtMost(ctx, p, h, path, limit)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return b, nil
}

// unreadable reports whether err says that the file itself is what the
// agent made it (too large, not a regular file, a symlink, under a
// non-directory): the agent's doing, graded, never a server failure.
func unreadable(err error) bool {
	for _, target := range []error{provider.ErrFileTooLarge, provider.ErrNotRegular, provider.ErrPathEscape, syscall.EISDIR, syscall.ENOTDIR, syscall.ELOOP} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

type verifyRequest struct {
	ExpectedNotes *[]string `json:"expected_notes"`
}

// VerifyReply is /verify's answer.
type VerifyReply struct {
	Reward        float64  `json:"reward"`
	Notes         []string `json:"notes"`
	ExpectedNotes []string `json:"expected_notes"`
	// TokenMatches: the session data's token is the sandbox's.
	TokenMatches bool `json:"token_matches"`
	// Reason says why the reward is 0 when a file could not be graded (a
	// notes.txt that is a FIFO, a directory, a link or over MaxNotesBytes).
	Reason string `json:"reason,omitempty"`
}

// Verify grades the notes and ends the session.
func (s *Server) Verify(ctx context.Context, sess *resources.Session, body []byte) (any, error) {
	var req verifyRequest
	if err := resources.DecodeData(body, &req); err != nil {
		return nil, err
	}
	if req.ExpectedNotes == nil {
		return nil, resources.Invalid("expected_notes is required")
	}
	rep := VerifyReply{ExpectedNotes: *req.ExpectedNotes, Notes: []string{}}
	err := sess.Owner.Do(ctx, sess.ID, func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) error {
		notes, err := readOptional(ctx, p, sb.Handle, NotesFile, MaxNotesBytes)
		if unreadable(err) {
			rep.Reason, notes = err.Error(), nil
		} else if err != nil {
			return err
		}
		tok, err := readOptional(ctx, p, sb.Handle, TokenFile, maxTokenBytes)
		if unreadable(err) {
			rep.Reason, tok = strings.TrimPrefix(rep.Reason+"; "+err.Error(), "; "), nil
		} else if err != nil {
			return err
		}
		if text := strings.TrimSuffix(string(notes), "\n"); text != "" {
			rep.Notes = strings.Split(text, "\n")
		}
		var data sessionData
		_ = json.Unmarshal(sb.Data, &data)
		rep.TokenMatches = data.SeedToken != "" && data.SeedToken == strings.TrimSpace(string(tok))
		return nil
	})
	if err != nil {
		return nil, err
	}
	if rep.Reason == "" && rep.TokenMatches && slices.Equal(rep.Notes, rep.ExpectedNotes) {
		rep.Reward = 1.0
	}
	if err := sess.Owner.EndSessionSandbox(ctx, sess.ID); err != nil {
		return nil, fmt.Errorf("end the session after verify: %w", err)
	}
	return rep, nil
}
