package http

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/sandboxowner/owner/internal/macs"
)

// SecretFile is the file in checkpoint.state_dir that keeps a generated
// session secret, so cookies stay valid across a restart.
const SecretFile = "session_secret"

// MinSecretLen is the shortest session secret accepted.
const MinSecretLen = 16

// ErrSecret: the session secret is unusable.
var ErrSecret = errors.New("session secret")

// LoadSessionSecret returns the secret cookies are signed with: configured
// when set; else the one persisted in stateDir, generated there on first use;
// else (no stateDir) a new random one for this process only, in which case
// generated is true and cookies do not survive a restart.
func LoadSessionSecret(configured, stateDir string) (secret []byte, generated bool, err error) {
	if configured != "" {
		if len(configured) < MinSecretLen {
			return nil, false, fmt.Errorf("%w: session_secret must be at least %d characters", ErrSecret, MinSecretLen)
		}
		return []byte(configured), false, nil
	}
	if stateDir == "" {
		return randomSecret(), true, nil
	}
	path := filepath.Join(stateDir, SecretFile)
	if b, err := os.ReadFile(path); err == nil {
		s := strings.TrimSpace(string(b))
		if len(s) < MinSecretLen {
			return nil, false, fmt.Errorf("%w: %s is shorter than %d characters", ErrSecret, path, MinSecretLen)
		}
		return []byte(s), false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, fmt.Errorf("%w: read %s: %w", ErrSecret, path, err)
	}
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return nil, false, fmt.Errorf("%w: create %s: %w", ErrSecret, stateDir, err)
	}
	s := hex.EncodeToString(randomSecret())
	// Create-only, so two servers racing on one state_dir agree on the
	// file that won.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return LoadSessionSecret("", stateDir)
	}
	if err != nil {
		return nil, false, fmt.Errorf("%w: create %s: %w", ErrSecret, path, err)
	}
	_, werr := f.WriteString(s + "\n")
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		return nil, false, fmt.Errorf("%w: write %s: %w", ErrSecret, path, err)
	}
	return []byte(s), false, nil
}

func randomSecret() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return b
}

// Signer makes and checks session cookie values: "<session id>.<HMAC>",
// where the HMAC-SHA256 covers the cookie name and the id, so a value is
// valid only for the cookie (server) it was issued by.
type Signer struct {
	name string
	macs *macs.Keyed
}

// NewSigner returns a signer for the cookie name with the secret.
func NewSigner(cookieName string, secret []byte) (*Signer, error) {
	if len(secret) < MinSecretLen {
		return nil, fmt.Errorf("%w: at least %d bytes are required", ErrSecret, MinSecretLen)
	}
	return &Signer{name: cookieName, macs: macs.New(secret)}, nil
}

var b64 = base64.RawURLEncoding

// NewID returns a fresh random session id.
func NewID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return b64.EncodeToString(b)
}

// Sign returns the cookie value for a session id.
func (s *Signer) Sign(id string) string {
	var sum [macs.Size]byte
	mac := s.macs.Append(sum[:0], s.name, "\x00", id)
	var v strings.Builder
	v.Grow(len(id) + 1 + b64.EncodedLen(macs.Size))
	v.WriteString(id)
	v.WriteByte('.')
	var enc [64]byte
	v.Write(b64.AppendEncode(enc[:0], mac))
	return v.String()
}

// MaxSessionIDLen is the longest session id a cookie carries: a typed
// seed's resources_session_id may be this long, and the cookie it is given
// must name it.
const MaxSessionIDLen = 128

// Verify returns the session id of a genuine cookie value; ok is false for a
// forged, tampered or malformed one.
func (s *Signer) Verify(value string) (id string, ok bool) {
	i := strings.LastIndexByte(value, '.')
	if i <= 0 || i > MaxSessionIDLen {
		return "", false
	}
	id = value[:i]
	var raw [64]byte
	src := value[i+1:]
	if b64.DecodedLen(len(src)) > len(raw) {
		return "", false
	}
	var in [128]byte
	n, err := b64.Decode(raw[:], append(in[:0], src...))
	if err != nil || !s.macs.Equal(raw[:n], s.name, "\x00", id) {
		return "", false
	}
	return id, true
}
