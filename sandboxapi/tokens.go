package sandboxapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/jsonw"
	"github.com/sandboxowner/owner/internal/macs"
)

// Token errors. Verify wraps one of them.
var (
	// ErrTokenInvalid: missing, malformed, or not signed with this secret.
	ErrTokenInvalid = errors.New("sandboxapi: invalid token")
	// ErrTokenExpired: well signed, but past its expiry.
	ErrTokenExpired = errors.New("sandboxapi: token expired")
	// ErrTokenWrongSandbox: well signed, but for another sandbox.
	ErrTokenWrongSandbox = errors.New("sandboxapi: token is for another sandbox")
	// ErrEmptySecret: NewTokens was given no secret.
	ErrEmptySecret = errors.New("sandboxapi: empty token secret")
)

// tokenVersion prefixes every token; macDomain separates these MACs from
// any other the same secret signs (session cookies, say).
const (
	tokenVersion = "v1"
	macDomain    = "sandboxowner/sandbox-access/v1\n"
)

// Tokens mints and verifies sandbox access tokens: HMAC-SHA256 over a
// payload naming one sandbox and an expiry. A token is
//
//	v1.<base64url(JSON {"sid": sandbox id, "exp": unix seconds})>.<base64url(MAC)>
//
// so an agent needs nothing but the token and the endpoint. Tokens are not
// stored: any server with the secret verifies them, across restarts.
type Tokens struct {
	macs *macs.Keyed
	clk  clock.Clock
}

// Claims are what a valid token says.
type Claims struct {
	SandboxID string    `json:"sid"`
	ExpiresAt time.Time `json:"-"`
}

type payload struct {
	SandboxID string `json:"sid"`
	Exp       int64  `json:"exp"`
}

// NewTokens returns a minter and verifier keyed by secret (copied), reading
// time from clk (clock.Real when nil).
func NewTokens(secret []byte, clk clock.Clock) (*Tokens, error) {
	if len(secret) == 0 {
		return nil, ErrEmptySecret
	}
	if clk == nil {
		clk = clock.Real{}
	}
	return &Tokens{macs: macs.New(secret), clk: clk}, nil
}

var b64 = base64.RawURLEncoding

// Mint returns a token for sandboxID valid until expiresAt (to the second,
// rounded down). The payload is what json.Marshal writes for it, written
// by hand: a token is minted on every /sandbox_access.
func (t *Tokens) Mint(sandboxID string, expiresAt time.Time) string {
	var pbuf, tbuf [256]byte
	p := append(pbuf[:0], `{"sid":`...)
	p = jsonw.AppendString(p, sandboxID)
	p = append(p, `,"exp":`...)
	p = strconv.AppendInt(p, expiresAt.Unix(), 10)
	p = append(p, '}')
	tok := append(tbuf[:0], tokenVersion+"."...)
	tok = b64.AppendEncode(tok, p)
	var sum [macs.Size]byte
	mac := t.macs.AppendTo(sum[:0], macDomain, tok[len(tokenVersion)+1:])
	tok = append(tok, '.')
	tok = b64.AppendEncode(tok, mac)
	return string(tok)
}

// Verify checks token and that it names sandboxID (when sandboxID is not
// empty). The signature is checked first, in constant time, so an expired or
// misdirected token is only reported as such when it is genuine.
func (t *Tokens) Verify(token, sandboxID string) (Claims, error) {
	version, rest, _ := strings.Cut(token, ".")
	body, sigText, ok := strings.Cut(rest, ".")
	if !ok || version != tokenVersion {
		return Claims{}, fmt.Errorf("%w: malformed", ErrTokenInvalid)
	}
	// A fourth part stays in sigText, where its dot is no base64url.
	var sbuf [64]byte
	sig, err := decode(sbuf[:0], sigText)
	if err != nil {
		return Claims{}, fmt.Errorf("%w: malformed signature", ErrTokenInvalid)
	}
	if !t.macs.Equal(sig, macDomain, body) {
		return Claims{}, fmt.Errorf("%w: bad signature", ErrTokenInvalid)
	}
	var pbuf [256]byte
	raw, err := decode(pbuf[:0], body)
	if err != nil {
		return Claims{}, fmt.Errorf("%w: malformed payload", ErrTokenInvalid)
	}
	p, ok := parsePayload(raw, sandboxID)
	if !ok {
		p = unmarshalPayload(raw)
	}
	if p.SandboxID == "" || p.Exp == 0 {
		return Claims{}, fmt.Errorf("%w: malformed payload", ErrTokenInvalid)
	}
	c := Claims{SandboxID: p.SandboxID, ExpiresAt: time.Unix(p.Exp, 0)}
	if !t.clk.Now().Before(c.ExpiresAt) {
		return c, fmt.Errorf("%w at %s", ErrTokenExpired, c.ExpiresAt.UTC().Format(time.RFC3339))
	}
	if sandboxID != "" && c.SandboxID != sandboxID {
		return c, fmt.Errorf("%w: token names %s", ErrTokenWrongSandbox, c.SandboxID)
	}
	return c, nil
}

// unmarshalPayload reads a payload as json.Unmarshal does (the zero
// payload for one it refuses), from a copy: raw is on Verify's stack.
func unmarshalPayload(raw []byte) payload {
	var p payload
	if err := json.Unmarshal(bytes.Clone(raw), &p); err != nil {
		return payload{}
	}
	return p
}

// decode appends the base64url text s decodes to to dst (a buffer on the
// caller's stack when it is large enough).
func decode(dst []byte, s string) ([]byte, error) {
	n := b64.DecodedLen(len(s))
	if n > cap(dst) {
		return b64.DecodeString(s)
	}
	// Text that decodes into dst (Verify's are 256 bytes at most) fits in
	// in; append would only grow it for a larger dst.
	var in [512]byte
	m, err := b64.Decode(dst[:n], append(in[:0], s...))
	return dst[:m], err
}

// parsePayload reads the payload Mint writes, {"sid":"<id>","exp":<n>},
// when its id is ASCII from the space up without a backslash (bytes JSON
// reads as they stand);
// ok is false for anything else, which json.Unmarshal reads instead (an
// escape, a byte it may replace as invalid UTF-8). The id is want itself
// when it names want, so that the usual check allocates nothing.
func parsePayload(raw []byte, want string) (p payload, ok bool) {
	const pre, mid = `{"sid":"`, `","exp":`
	if len(raw) < len(pre) || string(raw[:len(pre)]) != pre {
		return payload{}, false
	}
	raw = raw[len(pre):]
	i := 0
	for ; i < len(raw) && raw[i] != '"'; i++ {
		if c := raw[i]; c < 0x20 || c >= 0x80 || c == '\\' {
			return payload{}, false
		}
	}
	if len(raw)-i < len(mid) || string(raw[i:i+len(mid)]) != mid || raw[len(raw)-1] != '}' {
		return payload{}, false
	}
	digits := raw[i+len(mid) : len(raw)-1]
	if len(digits) == 0 || len(digits) > 1 && digits[0] == '0' {
		return payload{}, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return payload{}, false
		}
	}
	exp, err := strconv.ParseInt(string(digits), 10, 64)
	if err != nil {
		return payload{}, false
	}
	if id := raw[:i]; string(id) == want {
		p.SandboxID = want
	} else {
		p.SandboxID = string(id)
	}
	p.Exp = exp
	return p, true
}

// Access is what /sandbox_access adds to a local sandbox's descriptor.
type Access struct {
	// Endpoint is the sandbox's base URL; the routes are under it.
	Endpoint string `json:"endpoint"`
	// Token goes in "Authorization: Bearer <token>".
	Token string `json:"token"`
	// TokenExpiresAt is when Token stops working.
	TokenExpiresAt time.Time `json:"token_expires_at"`
}

// Access mints a token for sandboxID and returns it with the sandbox's
// endpoint under baseURL ("http://<host>:<port>").
func (t *Tokens) Access(baseURL, sandboxID string, expiresAt time.Time) Access {
	return Access{Endpoint: Endpoint(baseURL, sandboxID), Token: t.Mint(sandboxID, expiresAt), TokenExpiresAt: time.Unix(expiresAt.Unix(), 0).UTC()}
}

// Endpoint returns http://<host>:<port>/sandboxes/<sandbox_id> for baseURL
// http://<host>:<port>.
func Endpoint(baseURL, sandboxID string) string {
	return strings.TrimRight(baseURL, "/") + Prefix + sandboxID
}
