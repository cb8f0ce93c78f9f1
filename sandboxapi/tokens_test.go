package sandboxapi

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/clock"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func newTokens(t *testing.T, secret string, clk clock.Clock) *Tokens {
	t.Helper()
	tok, err := NewTokens([]byte(secret), clk)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestTokenRoundTripAndExpiry(t *testing.T) {
	clk := clock.NewManual(t0)
	tok := newTokens(t, "secret", clk)
	token := tok.Mint("sb-1", t0.Add(time.Minute))
	got, err := tok.Verify(token, "sb-1")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(Claims{SandboxID: "sb-1", ExpiresAt: t0.Add(time.Minute)}, got, cmp.Comparer(time.Time.Equal)); d != "" {
		t.Errorf("claims (-want +got):\n%s", d)
	}
	// Another server with the same secret (a restart) accepts it.
	if _, err := newTokens(t, "secret", clk).Verify(token, "sb-1"); err != nil {
		t.Errorf("same secret, new Tokens: %v", err)
	}
	clk.Advance(time.Minute - time.Nanosecond)
	if _, err := tok.Verify(token, "sb-1"); err != nil {
		t.Errorf("just before expiry: %v", err)
	}
	clk.Advance(time.Nanosecond)
	if _, err := tok.Verify(token, "sb-1"); !errors.Is(err, ErrTokenExpired) {
		t.Errorf("at expiry: %v, want ErrTokenExpired", err)
	}
}

func TestForgedTokensAreInvalid(t *testing.T) {
	tok := newTokens(t, "secret", clock.NewManual(t0))
	good := tok.Mint("sb-1", t0.Add(time.Hour))
	parts := strings.Split(good, ".")
	forgedPayload := base64.RawURLEncoding.EncodeToString([]byte(`{"sid":"sb-2","exp":9999999999}`))
	flip := func(s string) string { // change one character of a segment
		b := []byte(s)
		if b[0] == 'A' {
			b[0] = 'B'
		} else {
			b[0] = 'A'
		}
		return string(b)
	}
	for name, token := range map[string]string{
		"empty":                    "",
		"garbage":                  "not-a-token",
		"two parts":                parts[0] + "." + parts[1],
		"other version":            "v2." + parts[1] + "." + parts[2],
		"payload swapped":          parts[0] + "." + forgedPayload + "." + parts[2],
		"payload changed":          parts[0] + "." + flip(parts[1]) + "." + parts[2],
		"signature changed":        parts[0] + "." + parts[1] + "." + flip(parts[2]),
		"signature not base64":     parts[0] + "." + parts[1] + ".!!!",
		"signature empty":          parts[0] + "." + parts[1] + ".",
		"other secret":             newTokens(t, "other", clock.NewManual(t0)).Mint("sb-1", t0.Add(time.Hour)),
		"signed non-json payload":  signed(tok, "bm90IGpzb24"),
		"signed payload no expiry": signed(tok, base64.RawURLEncoding.EncodeToString([]byte(`{"sid":"sb-1"}`))),
	} {
		if _, err := tok.Verify(token, "sb-1"); !errors.Is(err, ErrTokenInvalid) {
			t.Errorf("%s: %v, want ErrTokenInvalid", name, err)
		}
	}
	if _, err := tok.Verify(good, "sb-2"); !errors.Is(err, ErrTokenWrongSandbox) {
		t.Errorf("another sandbox's token: %v", err)
	}
	if _, err := NewTokens(nil, nil); !errors.Is(err, ErrEmptySecret) {
		t.Errorf("empty secret: %v", err)
	}
}

// signed builds a token with a genuine MAC over an arbitrary payload.
func signed(tok *Tokens, body string) string {
	return tokenVersion + "." + body + "." + base64.RawURLEncoding.EncodeToString(tok.mac(body))
}

func TestAccessAndEndpoint(t *testing.T) {
	tok := newTokens(t, "s", clock.NewManual(t0))
	a := tok.Access("http://127.0.0.1:8080/", "sb-9", t0.Add(time.Hour))
	if a.Endpoint != "http://127.0.0.1:8080/sandboxes/sb-9" {
		t.Errorf("endpoint %q", a.Endpoint)
	}
	if _, err := tok.Verify(a.Token, "sb-9"); err != nil {
		t.Errorf("access token: %v", err)
	}
	if !a.TokenExpiresAt.Equal(t0.Add(time.Hour)) {
		t.Errorf("expiry %s", a.TokenExpiresAt)
	}
}
