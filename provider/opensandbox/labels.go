package opensandbox

import (
	"encoding/base32"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/sandboxowner/owner/provider"
)

// Sandbox metadata must follow the Kubernetes label rules. Keys are checked;
// a value that breaks them (too long, a ':' or '/') is sent encoded, as
// encPrefix plus lower-case base32hex, and decoded when read back, so that
// what the owner compares is what it set.
var (
	labelValue = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$`)
	labelName  = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	dnsPrefix  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

const encPrefix = "b32."

var b32 = base32.HexEncoding.WithPadding(base32.NoPadding)

// createLabel carries a per-request token, so that a create retried after an
// ambiguous failure finds the sandbox the first attempt made.
const createLabel = "sandboxowner.io/create"

// tokenLabel carries the sandbox's execd access token (see execdToken), so
// that a server started again knows it. Labels are read with the lifecycle
// API key only, which can run commands in any sandbox anyway.
const tokenLabel = "sandboxowner.io/execd-token"

// ownerLabels is md without the labels this provider keeps for itself: what
// the owner set, and all it is shown.
func ownerLabels(md map[string]string) map[string]string {
	delete(md, createLabel)
	delete(md, tokenLabel)
	return md
}

func validLabelKey(k string) bool {
	prefix, name, has := strings.Cut(k, "/")
	if !has {
		name, prefix = prefix, ""
	}
	if has && (len(prefix) > 253 || !dnsPrefix.MatchString(prefix) || prefix == "opensandbox.io") {
		return false
	}
	return len(name) <= 63 && labelName.MatchString(name)
}

// encodeLabels turns metadata into valid labels.
func encodeLabels(md map[string]string) (map[string]string, error) {
	out := make(map[string]string, len(md))
	for k, v := range md {
		if !validLabelKey(k) {
			return nil, fmt.Errorf("opensandbox: metadata key %q is not a Kubernetes label key: %w", k, provider.ErrInvalidSpec)
		}
		if len(v) <= 63 && labelValue.MatchString(v) && !strings.HasPrefix(v, encPrefix) {
			out[k] = v
			continue
		}
		enc := encPrefix + strings.ToLower(b32.EncodeToString([]byte(v)))
		if len(enc) > 63 {
			return nil, fmt.Errorf("opensandbox: metadata %s: value of %d bytes is too long for a label: %w", k, len(v), provider.ErrInvalidSpec)
		}
		out[k] = enc
	}
	return out, nil
}

// decodeLabels undoes encodeLabels; a value that does not decode is kept.
func decodeLabels(md map[string]string) map[string]string {
	out := make(map[string]string, len(md))
	for k, v := range md {
		if rest, ok := strings.CutPrefix(v, encPrefix); ok {
			if b, err := b32.DecodeString(strings.ToUpper(rest)); err == nil {
				v = string(b)
			}
		}
		out[k] = v
	}
	return out
}

// Snapshots carry no metadata in the API, so the owner's labels (those of
// the source sandbox), its name and a request token travel in the snapshot's
// name, as a query string after snapNamePrefix.
const snapNamePrefix = "sandboxowner?"

func encodeSnapshotName(name, token string, md map[string]string) string {
	v := url.Values{}
	v.Set("name", name)
	v.Set("token", token)
	for k, val := range md {
		v.Set("md."+k, val)
	}
	return snapNamePrefix + v.Encode()
}

// decodeSnapshotName returns the name, token and labels; ok is false for a
// snapshot someone else named.
func decodeSnapshotName(s string) (name, token string, md map[string]string, ok bool) {
	rest, ok := strings.CutPrefix(s, snapNamePrefix)
	if !ok {
		return s, "", nil, false
	}
	v, err := url.ParseQuery(rest)
	if err != nil {
		return s, "", nil, false
	}
	md = map[string]string{}
	for k := range v {
		if key, isMD := strings.CutPrefix(k, "md."); isMD {
			md[key] = v.Get(k)
		}
	}
	return v.Get("name"), v.Get("token"), md, true
}

// hasLabels reports whether md carries every label of want.
func hasLabels(md, want map[string]string) bool {
	for k, v := range want {
		if md[k] != v {
			return false
		}
	}
	return true
}
