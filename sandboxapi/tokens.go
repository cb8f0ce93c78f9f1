package sandboxapi

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sandboxowner/owner/clock"
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
	secret []byte
	clk    clock.Clock
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
	return &Tokens{secret: append([]byte(nil), secret...), clk: clk}, nil
}

// Mint returns a token for sandboxID valid until expiresAt (to the second,
// rounded down).
func (t *Tokens) Mint(sandboxID string, expiresAt time.Time) string {
	b, err := json.Marshal(payload{SandboxID: sandboxID, Exp: expiresAt.Unix()})
	if err != nil {
		panic(fmt.Sprintf("sandboxapi: marshal token payload: %v", err)) // a string and an int never fail
	}
	body := base64.RawURLEncoding.EncodeToString(b)
	return tokenVersion + "." + body + "." + base64.RawURLEncoding.EncodeToString(t.mac(body))
}

func (t *Tokens) mac(body string) []byte {
	m := hmac.New(sha256.New, t.secret)
	m.Write([]byte(macDomain))
	m.Write([]byte(body))
	return m.Sum(nil)
}

// Verify checks token and that it names sandboxID (when sandboxID is not
// empty). The signature is checked first, in constant time, so an expired or
// misdirected token is only reported as such when it is genuine.
func (t *Tokens) Verify(token, sandboxID string) (Claims, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[0] != tokenVersion {
		return Claims{}, fmt.Errorf("%w: malformed", ErrTokenInvalid)
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return Claims{}, fmt.Errorf("%w: malformed signature", ErrTokenInvalid)
	}
	if !hmac.Equal(sig, t.mac(parts[1])) {
		return Claims{}, fmt.Errorf("%w: bad signature", ErrTokenInvalid)
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return Claims{}, fmt.Errorf("%w: malformed payload", ErrTokenInvalid)
	}
	var p payload
	if err := json.Unmarshal(raw, &p); err != nil || p.SandboxID == "" || p.Exp == 0 {
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
