package sandboxapi

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/racebuild"
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
		"four parts":               good + "." + parts[2],
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
	return tokenVersion + "." + body + "." + base64.RawURLEncoding.EncodeToString(tok.macs.Append(nil, macDomain, body))
}

// A token is "v1.<base64url of json.Marshal of the payload>.<base64url of
// HMAC-SHA256 of the domain and that text>": what a server signed before a
// restart or an upgrade still verifies, and an id JSON escapes is escaped as
// json.Marshal escapes it.
func TestTokenFormat(t *testing.T) {
	tok := newTokens(t, "secret", clock.NewManual(t0))
	for _, id := range []string{"sb-1", "a<b>&\"c\u2028", strings.Repeat("x", 300)} {
		p, _ := json.Marshal(payload{SandboxID: id, Exp: t0.Add(time.Hour).Unix()})
		body := base64.RawURLEncoding.EncodeToString(p)
		mac := hmac.New(sha256.New, []byte("secret"))
		mac.Write([]byte(macDomain + body))
		want := "v1." + body + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
		if got := tok.Mint(id, t0.Add(time.Hour)); got != want {
			t.Errorf("token for %q: %s, want %s", id, got, want)
		}
		if c, err := tok.Verify(want, ""); err != nil || c.SandboxID != id {
			t.Errorf("verify of the token for %q: %+v, %v", id, c, err)
		}
	}
}

// A genuine payload other than the one Mint writes is read as json.Unmarshal
// reads it: spaces, escapes and a key's case are accepted; a number with a
// leading zero, a negative one, trailing bytes and a missing field are not
// (each signed, so only the payload decides).
func TestSignedPayloadsAsJSONReadsThem(t *testing.T) {
	tok := newTokens(t, "secret", clock.NewManual(t0))
	exp := t0.Add(time.Hour).Unix()
	enc := func(s string) string { return signed(tok, base64.RawURLEncoding.EncodeToString([]byte(s))) }
	for _, p := range []string{
		fmt.Sprintf(`{ "sid": "sb-1", "exp": %d }`, exp),
		fmt.Sprintf(`{"sid":"sb\u002d1","exp":%d}`, exp),
		fmt.Sprintf(`{"SID":"sb-1","exp":%d}`, exp),
		fmt.Sprintf(`{"exp":%d,"sid":"sb-1"}`, exp),
	} {
		if c, err := tok.Verify(enc(p), "sb-1"); err != nil || c.SandboxID != "sb-1" || c.ExpiresAt.Unix() != exp {
			t.Errorf("%s: %+v, %v; want sb-1 until %d", p, c, err, exp)
		}
	}
	for _, p := range []string{
		`{"sid":"sb-1","exp":0` + fmt.Sprint(exp) + `}`,
		fmt.Sprintf(`{"sid":"sb-1","exp":%d}x`, exp),
		`{"sid":"sb-1","exp":0}`,
		`{"sid":"","exp":5}`,
		`{"sid":"sb-1","exp":}`,
		`{"sid":"sb-1","exp":99999999999999999999}`,
		`{"sid":"sb-1`,
		`{"sid":"`,
		`{"sid":"sb-1","exp":`,
		`{"sid":"` + strings.Repeat("x", 300) + `"}`,
	} {
		if c, err := tok.Verify(enc(p), "sb-1"); !errors.Is(err, ErrTokenInvalid) {
			t.Errorf("%s: %+v, %v; want ErrTokenInvalid", p, c, err)
		}
	}
	if c, err := tok.Verify(enc(fmt.Sprintf(`{"sid":"sb-1","exp":-%d}`, exp)), "sb-1"); !errors.Is(err, ErrTokenExpired) {
		t.Errorf("a negative expiry: %+v, %v; want ErrTokenExpired", c, err)
	}
	// A signature too long to be one is a bad one, and no longer parsed.
	good := tok.Mint("sb-1", t0.Add(time.Hour))
	if _, err := tok.Verify(good+strings.Repeat("A", 200), "sb-1"); !errors.Is(err, ErrTokenInvalid) {
		t.Errorf("a long signature: %v, want ErrTokenInvalid", err)
	}
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

// An id of any bytes reads as json.Unmarshal reads it, the ones the
// payload's fast reading takes as they stand (ASCII from the space up) and
// the ones it leaves to json.Unmarshal (invalid UTF-8 becomes U+FFFD).
func TestSignedIDsReadAsJSONReadsThem(t *testing.T) {
	tok := newTokens(t, "secret", clock.NewManual(t0))
	exp := t0.Add(time.Hour).Unix()
	for _, id := range []string{"sb-1", "a b", "~\x7f", "a<b>&", "\x80", "sb\xff", "é", "\x1f"} {
		raw := `{"sid":"` + id + `","exp":` + fmt.Sprint(exp) + `}`
		var want payload
		if err := json.Unmarshal([]byte(raw), &want); err != nil {
			want = payload{}
		}
		c, err := tok.Verify(signed(tok, base64.RawURLEncoding.EncodeToString([]byte(raw))), "")
		if want.SandboxID == "" {
			if !errors.Is(err, ErrTokenInvalid) {
				t.Errorf("%q: %+v, %v; want ErrTokenInvalid as json.Unmarshal refuses it", id, c, err)
			}
			continue
		}
		if err != nil || c.SandboxID != want.SandboxID {
			t.Errorf("%q: %q, %v; want %q", id, c.SandboxID, err, want.SandboxID)
		}
	}
}

// The check on every sandbox request allocates nothing for a token Mint
// wrote: its payload and signature are decoded on the stack and the id is
// the one asked for. The ids span what the payload's fast reading takes,
// and the expiry has every digit's edge (0 and 9). Under -race it cannot be
// counted (see racebuild): CI, which runs only -race, never runs it; the
// mutants script and a plain go test do.
func TestVerifyingAMintedTokenAllocatesNothing(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("the race detector's sync.Pool drops items at random, so allocations vary")
	}
	tok := newTokens(t, "secret", clock.NewManual(t0))
	for _, id := range []string{"sb-1", " !~\x7f", strings.Repeat("x", 200)} {
		token := tok.Mint(id, time.Unix(1900000009, 0))
		if _, err := tok.Verify(token, id); err != nil {
			t.Fatalf("%q: %v", id, err)
		}
		if n := testing.AllocsPerRun(100, func() { _, _ = tok.Verify(token, id) }); n != 0 {
			t.Errorf("%q: Verify allocates %v times, want 0", id, n)
		}
	}
}
