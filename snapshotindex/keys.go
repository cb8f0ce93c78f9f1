package snapshotindex

import (
	"encoding/binary"
	"strconv"
	"strings"
)

// Key layout (also in the package doc). Every variable component is escaped
// so that it never contains '/', which keeps prefixes unambiguous: the
// records of checkpoint "a" can never be confused with those of "a/b".
const (
	keySchema   = "v" // schema version, decimal
	keySeq      = "q" // last Seq handed out, 8 bytes big-endian
	pfxMeta     = "c/"
	pfxRecord   = "r/"
	pfxRef      = "s/"
	pfxTomb     = "t/"
	pfxIntent   = "i/"
	pfxTemplate = "m/"
	schemaValue = 1
)

// escape replaces '%' and '/' with %25 and %2F. Ids without either (the
// usual case) are returned as they are, without allocating.
func escape(s string) string {
	if !strings.ContainsAny(s, "%/") {
		return s
	}
	return strings.ReplaceAll(strings.ReplaceAll(s, "%", "%25"), "/", "%2F")
}

// unescape inverts escape. Every '%' in an escaped string starts "%25" or
// "%2F", so replacing the two tokens one after the other is exact.
func unescape(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	return strings.ReplaceAll(strings.ReplaceAll(s, "%2F", "/"), "%25", "%")
}

func metaKey(id string) []byte { return []byte(pfxMeta + escape(id)) }

// recordPrefix is the prefix of every record of one checkpoint.
func recordPrefix(id string) []byte { return []byte(pfxRecord + escape(id) + "/") }

func recordKey(id, session string) []byte {
	return []byte(pfxRecord + escape(id) + "/" + escape(session))
}

// refPrefix is the prefix of every reverse reference of one snapshot.
func refPrefix(snapshot string) []byte { return []byte(pfxRef + escape(snapshot) + "/") }

func refKey(snapshot, id string) []byte {
	return []byte(pfxRef + escape(snapshot) + "/" + escape(id))
}

func tombKey(snapshot string) []byte { return []byte(pfxTomb + escape(snapshot)) }

func templateKey(key string) []byte { return []byte(pfxTemplate + escape(key)) }

func intentPrefix(kind string) []byte {
	if kind == "" {
		return []byte(pfxIntent)
	}
	return []byte(pfxIntent + escape(kind) + "/")
}

func intentKey(k IntentKey) []byte {
	return []byte(pfxIntent + escape(k.Kind) + "/" + escape(k.ID))
}

// splitRef parses "s/<snapshot>/<checkpoint>".
func splitRef(key []byte) (snapshot, id string, ok bool) {
	rest, found := strings.CutPrefix(string(key), pfxRef)
	if !found {
		return "", "", false
	}
	snap, ckpt, found := strings.Cut(rest, "/")
	if !found || snap == "" || ckpt == "" || strings.Contains(ckpt, "/") {
		return "", "", false
	}
	return unescape(snap), unescape(ckpt), true
}

func encodeSeq(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }

func encodeSchema() []byte { return []byte(strconv.Itoa(schemaValue)) }
