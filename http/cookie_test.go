package http_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	httpapi "github.com/sandboxowner/owner/http"
)

// TestSessionSecretLength: a configured secret, or one read from the state
// dir, needs MinSecretLen characters; one shorter is refused.
func TestSessionSecretLength(t *testing.T) {
	short, long := strings.Repeat("s", httpapi.MinSecretLen-1), strings.Repeat("s", httpapi.MinSecretLen)
	if _, _, err := httpapi.LoadSessionSecret(short, ""); !errors.Is(err, httpapi.ErrSecret) {
		t.Errorf("a configured secret of %d characters: %v", len(short), err)
	}
	if got, generated, err := httpapi.LoadSessionSecret(long, ""); err != nil || generated || string(got) != long {
		t.Errorf("a configured secret of %d characters: %q %v %v", len(long), got, generated, err)
	}
	for _, tc := range []struct {
		content string
		ok      bool
	}{{short + "\n", false}, {long + "\n", true}} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, httpapi.SecretFile), []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, _, err := httpapi.LoadSessionSecret("", dir)
		if tc.ok != (err == nil) || (tc.ok && string(got) != strings.TrimSpace(tc.content)) {
			t.Errorf("a stored secret of %d characters: %q, %v", len(strings.TrimSpace(tc.content)), got, err)
		}
	}
	if _, err := httpapi.NewSigner("c", []byte(short)); !errors.Is(err, httpapi.ErrSecret) {
		t.Errorf("a signer with a %d-byte secret: %v", len(short), err)
	}
	if _, err := httpapi.NewSigner("c", []byte(long)); err != nil {
		t.Errorf("a signer with a %d-byte secret: %v", len(long), err)
	}
}

// TestSessionSecretGenerated: without a state dir the secret is random and
// said to be generated; with one it is generated once, kept in the state
// dir (owner-only) and read back.
func TestSessionSecretGenerated(t *testing.T) {
	a, generated, err := httpapi.LoadSessionSecret("", "")
	if err != nil || !generated || len(a) < httpapi.MinSecretLen {
		t.Fatalf("no state dir: %d bytes, generated %v, %v", len(a), generated, err)
	}
	if b, _, _ := httpapi.LoadSessionSecret("", ""); string(a) == string(b) {
		t.Error("two generated secrets are equal")
	}
	dir := filepath.Join(t.TempDir(), "state")
	first, generated, err := httpapi.LoadSessionSecret("", dir)
	if err != nil || generated {
		t.Fatalf("first use of a state dir: generated %v, %v", generated, err)
	}
	again, _, err := httpapi.LoadSessionSecret("", dir)
	if err != nil || string(again) != string(first) {
		t.Errorf("the stored secret was not read back: %q vs %q, %v", again, first, err)
	}
	fi, err := os.Stat(filepath.Join(dir, httpapi.SecretFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the secret file: %v, %v", fi, err)
	}
}

// TestCookieValues: a cookie names its session for the cookie name it was
// signed for; a session id of up to 128 characters is accepted; a longer
// one, an empty one, a forged or tampered value, or another server's cookie
// is not.
func TestCookieValues(t *testing.T) {
	secret := []byte("a-test-secret-of-32-bytes-length")
	s, err := httpapi.NewSigner("notes", secret)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := httpapi.NewSigner("swebench", secret)
	id := httpapi.NewID()
	if got, ok := s.Verify(s.Sign(id)); !ok || got != id {
		t.Errorf("a genuine cookie: %q %v", got, ok)
	}
	longest := strings.Repeat("i", httpapi.MaxSessionIDLen)
	if got, ok := s.Verify(s.Sign(longest)); !ok || got != longest {
		t.Errorf("a %d-character id: %q %v", len(longest), got, ok)
	}
	v := s.Sign("session-1")
	for name, bad := range map[string]string{
		"129-character id": s.Sign(longest + "i"),
		"empty id":         s.Sign(""),
		"no signature":     id,
		"tampered":         "session-2" + strings.TrimPrefix(v, "session-1"),
		"not base64":       id + ".***",
		"another server":   other.Sign(id),
	} {
		if got, ok := s.Verify(bad); ok {
			t.Errorf("%s: accepted as %q", name, got)
		}
	}
	if httpapi.NewID() == id {
		t.Error("two session ids are equal")
	}
	// The value is "<id>.<base64url HMAC-SHA256 of name, NUL, id>": what a
	// server before a restart (or an upgrade) signed must still verify.
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("notes\x00session-1"))
	if want := "session-1." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil)); v != want {
		t.Errorf("cookie value %q, want %q", v, want)
	}
	for name, bad := range map[string]string{
		"a signature too long to be one": "session-1." + strings.Repeat("A", 200),
		"a padded signature":             v + "=",
	} {
		if got, ok := s.Verify(bad); ok {
			t.Errorf("%s: accepted as %q", name, got)
		}
	}
}

// TestSessionSecretUnreadable: a secret file that cannot be read (a
// directory in its place) or a state dir that cannot be made (a file in its
// place) is ErrSecret, never a new secret that would forget every cookie.
func TestSessionSecretUnreadable(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, httpapi.SecretFile), 0o700); err != nil {
		t.Fatal(err)
	}
	if s, _, err := httpapi.LoadSessionSecret("", dir); !errors.Is(err, httpapi.ErrSecret) {
		t.Errorf("a directory for the secret file: %q, %v", s, err)
	}
	file := filepath.Join(t.TempDir(), "state")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if s, _, err := httpapi.LoadSessionSecret("", file); !errors.Is(err, httpapi.ErrSecret) {
		t.Errorf("a file for the state dir: %q, %v", s, err)
	}
}
