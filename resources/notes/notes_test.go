package notes_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/problem"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/provider/local"
	"github.com/sandboxowner/owner/resources"
	"github.com/sandboxowner/owner/resources/notes"
	"github.com/sandboxowner/owner/sandbox"
)

// providers the notes server must run on unchanged.
func providers(t *testing.T) map[string]provider.Provider {
	lp, err := local.New(local.Options{Root: t.TempDir(), Templates: map[string]string{notes.Image: ""}})
	if err != nil {
		t.Fatalf("local provider: %v", err)
	}
	t.Cleanup(func() { _ = lp.Close() }) // its directories made ahead go before the temporary root
	return map[string]provider.Provider{"fake": fake.New(fake.Options{}), "local": lp}
}

func TestNotesOnEveryProvider(t *testing.T) {
	for name, p := range providers(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			own, err := owner.New(ctx, owner.Config{Name: "notes", Provider: p})
			if err != nil {
				t.Fatal(err)
			}
			defer own.Close()
			s := notes.New(notes.Options{})
			sess := &resources.Session{ID: "s1", Owner: own, Log: logrus.New()}

			if _, err := s.Verify(ctx, sess, []byte(`{"expected_notes":[]}`)); !errors.Is(err, sandbox.ErrNone) {
				t.Fatalf("verify before seed: %v", err)
			}
			v, err := s.Seed(ctx, sess, []byte(`{"whatever": 1}`))
			if err != nil {
				t.Fatal(err)
			}
			var data struct {
				SeedToken string `json:"seed_token"`
			}
			if err := json.Unmarshal(v.(json.RawMessage), &data); err != nil || len(data.SeedToken) != 32 {
				t.Fatalf("seed reply %s: %v", v, err)
			}
			again, err := s.Seed(ctx, sess, nil)
			if err != nil || string(again.(json.RawMessage)) != string(v.(json.RawMessage)) {
				t.Fatalf("repeated seed: %s, %v", again, err)
			}
			appendNote := s.Tools()[notes.RouteAppend]
			for _, line := range []string{"one", "it's \"quoted\" $HOME `x`", ""} {
				body, _ := json.Marshal(map[string]string{"line": line})
				if _, err := appendNote(ctx, sess, body); err != nil {
					t.Fatalf("append %q: %v", line, err)
				}
			}
			if _, err := appendNote(ctx, sess, []byte(`{"line":"a\nb"}`)); err == nil {
				t.Error("a line with a newline was accepted")
			}
			r, err := s.Verify(ctx, sess, []byte(`{"expected_notes":["one","it's \"quoted\" $HOME `+"`x`"+`",""]}`))
			if err != nil {
				t.Fatal(err)
			}
			rep := r.(notes.VerifyReply)
			if rep.Reward != 1 || !rep.TokenMatches {
				t.Errorf("verify: %+v", rep)
			}
			if _, ok := own.SessionSandbox(context.Background(), "s1"); ok {
				t.Error("verify did not end the session")
			}
		})
	}
}

func TestVerifyRewardsZero(t *testing.T) {
	ctx := context.Background()
	fk := fake.New(fake.Options{})
	own, err := owner.New(ctx, owner.Config{Name: "notes", Provider: fk})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	s := notes.New(notes.Options{})
	for _, tc := range []struct {
		name   string
		break_ func(sess *resources.Session)
		expect string
	}{
		{name: "other notes", expect: `{"expected_notes":["two"]}`},
		{name: "a token that does not match", expect: `{"expected_notes":["one"]}`, break_: func(sess *resources.Session) {
			sb, _ := own.SessionSandbox(context.Background(), sess.ID)
			if err := fk.WriteFile(ctx, sb.Handle, notes.TokenFile, []byte("forged")); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sess := &resources.Session{ID: tc.name, Owner: own, Log: logrus.New()}
			if _, err := s.Seed(ctx, sess, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Tools()[notes.RouteAppend](ctx, sess, []byte(`{"line":"one"}`)); err != nil {
				t.Fatal(err)
			}
			if tc.break_ != nil {
				tc.break_(sess)
			}
			r, err := s.Verify(ctx, sess, []byte(tc.expect))
			if err != nil {
				t.Fatal(err)
			}
			if rep := r.(notes.VerifyReply); rep.Reward != 0 {
				t.Errorf("reward %v, want 0: %+v", rep.Reward, rep)
			}
		})
	}
	bad := &resources.Session{ID: "bad", Owner: own, Log: logrus.New()}
	for _, body := range []string{`{}`, `{"expected_notes": "one"}`, `{`} {
		var he *problem.Error
		if _, err := s.Verify(ctx, bad, []byte(body)); !errors.As(err, &he) || he.Status != 422 {
			t.Errorf("verify %s: %v, want 422", body, err)
		}
	}
	if diff := cmp.Diff([]string{notes.RouteAppend}, keys(s.Tools())); diff != "" {
		t.Errorf("tools (-want +got):\n%s", diff)
	}
}

func keys(m map[string]resources.ToolFunc) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// A notes.txt the agent made a FIFO, a directory, a link or a huge file is
// graded 0 with a reason, and the session ends as after any verify: it used
// to be a 500 that left the session open (and a 200 MB file took verify to
// 1.3 GB). append_note refuses it with 409.
func TestVerifyGradesAnUnreadableNotesFileZero(t *testing.T) {
	ctx := context.Background()
	lp, err := local.New(local.Options{Root: t.TempDir(), Templates: map[string]string{notes.Image: ""}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lp.Close() }) // its directories made ahead go before the temporary root
	own, err := owner.New(ctx, owner.Config{Name: "notes", Provider: lp})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	s := notes.New(notes.Options{})
	for name, make_ := range map[string]string{
		"fifo":      "mkfifo notes.txt",
		"directory": "mkdir notes.txt",
		"symlink":   "ln -s .seed_token notes.txt",
		"huge":      fmt.Sprintf("head -c %d /dev/zero > notes.txt", notes.MaxNotesBytes+1),
		"token":     "rm .seed_token && mkfifo .seed_token",
	} {
		t.Run(name, func(t *testing.T) {
			sess := &resources.Session{ID: name, Owner: own, Log: logrus.New()}
			if _, err := s.Seed(ctx, sess, nil); err != nil {
				t.Fatal(err)
			}
			sb, _ := own.SessionSandbox(ctx, name)
			if res, err := lp.Exec(ctx, sb.Handle, provider.ExecRequest{Command: make_}); err != nil || res.ExitCode != 0 {
				t.Fatalf("%s: %+v %v", make_, res, err)
			}
			if name != "token" {
				var he *problem.Error
				if _, err := s.Tools()[notes.RouteAppend](ctx, sess, []byte(`{"line":"one"}`)); !errors.As(err, &he) || he.Status != 409 || he.Code != notes.CodeNotesUnreadable {
					t.Errorf("append to it: %v, want 409 %s", err, notes.CodeNotesUnreadable)
				}
			}
			r, err := s.Verify(ctx, sess, []byte(`{"expected_notes":[]}`))
			if err != nil {
				t.Fatalf("verify: %v", err)
			}
			if rep := r.(notes.VerifyReply); rep.Reward != 0 || rep.Reason == "" {
				t.Errorf("verify: %+v, want reward 0 with a reason", rep)
			}
			if _, ok := own.SessionSandbox(ctx, name); ok {
				t.Error("verify did not end the session")
			}
		})
	}
}

// append_note's reply is {"success":true} however it is encoded: written
// by the HTTP layer (AppendJSON, no reflection) and by encoding/json (MCP's
// tool results).
func TestAppendNoteRepliesSuccessEitherWay(t *testing.T) {
	ctx := context.Background()
	own, err := owner.New(ctx, owner.Config{Name: "notes", Provider: fake.New(fake.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	s := notes.New(notes.Options{})
	sess := &resources.Session{ID: "s1", Owner: own, Log: logrus.New()}
	if _, err := s.Seed(ctx, sess, nil); err != nil {
		t.Fatal(err)
	}
	r, err := s.Tools()[notes.RouteAppend](ctx, sess, []byte(`{"line":"one"}`))
	if err != nil {
		t.Fatal(err)
	}
	marshalled, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	a, ok := r.(interface{ AppendJSON([]byte) ([]byte, error) })
	if !ok {
		t.Fatalf("the reply %T writes no JSON of its own", r)
	}
	appended, err := a.AppendJSON([]byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{`{"success":true}`, `x{"success":true}`}, []string{string(marshalled), string(appended)}); diff != "" {
		t.Errorf("replies (-want +got):\n%s", diff)
	}
}
