package notes_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/provider/local"
	"github.com/sandboxowner/owner/resources"
	"github.com/sandboxowner/owner/resources/notes"
)

// providers the notes server must run on unchanged.
func providers(t *testing.T) map[string]provider.Provider {
	lp, err := local.New(local.Options{Root: t.TempDir(), Templates: map[string]string{notes.Image: ""}})
	if err != nil {
		t.Fatalf("local provider: %v", err)
	}
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

			if _, err := s.Verify(ctx, sess, []byte(`{"expected_notes":[]}`)); !errors.Is(err, owner.ErrNoSessionSandbox) {
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
		var he *resources.Error
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
