package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
)

// op is one kind of workload step, with its weight.
type op struct {
	name   string
	weight int
	do     func(r *run)
}

func ops() []op {
	return []op{
		{"seed", 18, (*run).opSeed},
		{"append", 26, (*run).opAppend},
		{"verify", 9, (*run).opVerify},
		{"close", 4, (*run).opClose},
		{"commit", 12, (*run).opCommit},
		{"recommit", 2, (*run).opRecommit},
		{"restore", 7, (*run).opRestore},
		{"restore-in-place", 2, (*run).opRestoreInPlace},
		{"retire", 3, (*run).opRetire},
		{"release", 6, (*run).opRelease},
		{"advance", 8, (*run).opAdvance},
		{"control", 8, (*run).opControl},
		{"agent-exec", 5, (*run).opAgentExec},
	}
}

func (r *run) doStep() {
	all := ops()
	if r.cfg.Keyed {
		all = append(all, keyedOps()...)
	}
	total := 0
	for _, o := range all {
		total += o.weight
	}
	n := r.rng.IntN(total)
	for _, o := range all {
		if n < o.weight {
			o.do(r)
			return
		}
		n -= o.weight
	}
}

// token draws a fresh seed token.
func (r *run) token() string { return fmt.Sprintf("tok-%016x", r.rng.Uint64()) }

func (r *run) spec() provider.Spec {
	return provider.Spec{Image: "notes", TTLSeconds: r.ttl.Seconds()}
}

// notesSetup is the notes server's setup: it writes a token to .seed_token
// and returns it as session data. fail makes it fail after the write.
func notesSetup(token string, fail bool, ran *bool) sandbox.SetupFunc {
	return func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) (json.RawMessage, error) {
		*ran = true
		if err := p.WriteFile(ctx, sb.Handle, tokenFile, []byte(token)); err != nil {
			return nil, fmt.Errorf("write %s: %w", tokenFile, err)
		}
		if fail {
			return nil, errors.New("setup failed on purpose")
		}
		return json.RawMessage(fmt.Sprintf(`{"seed_token":%q}`, token)), nil
	}
}

// appendNote is the notes server's append_note tool.
func appendNote(line string) sandbox.DoFunc {
	return func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) error {
		old, err := p.ReadFile(ctx, sb.Handle, notesFile)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return p.WriteFile(ctx, sb.Handle, notesFile, append(old, []byte(line+"\n")...))
	}
}

// pickSession picks a session, live ones with probability pLive when some
// are live.
func (r *run) pickSession(pLive float64) string {
	live, absent := r.m.live(), r.m.absent()
	v := r.rng.Float64()
	switch {
	case len(live) > 0 && (v < pLive || len(absent) == 0):
		return sample(r.rng, live)
	case len(absent) > 0:
		return sample(r.rng, absent)
	}
	return sample(r.rng, r.m.ids)
}

func (r *run) noteStopFault() {
	if r.injectedNow(fake.OpStop) > 0 {
		r.fire(FaultStopFail)
	}
}
