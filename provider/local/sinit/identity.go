package sinit

import (
	"hash/fnv"
	"reflect"
	"strconv"
	"strings"
)

// ProtocolVersion counts the changes to what the server and an init
// expect of each other that the messages' shape does not show (a new
// meaning of a field, a step the init takes or no longer takes): bump it
// with any such change. Identity covers the shape itself.
const ProtocolVersion = 1

// Identity names the init protocol this build speaks: ProtocolVersion and
// a fingerprint of the messages (each field's name, type and JSON name),
// the descriptors, stage names and mount kinds. The provider uses a
// separate init binary only if it answers the server's own Identity (see
// StageIdentity): one built from other sources is refused, never run.
func Identity() string {
	var b strings.Builder
	describe(&b, reflect.TypeFor[Msg](), map[reflect.Type]bool{})
	for _, s := range []string{Name, StageSetup, StageRun, StageIdentity,
		OpROBind, OpBind, OpSymlink, OpHideDir, OpDev, OpProc, OpTmp,
		strconv.Itoa(Fd), strconv.Itoa(ExeFd), strconv.Itoa(MaxMsg)} {
		b.WriteString(s)
		b.WriteByte(';')
	}
	h := fnv.New64a()
	h.Write([]byte(b.String()))
	return "sandboxowner-init protocol " + strconv.Itoa(ProtocolVersion) + " " + strconv.FormatUint(h.Sum64(), 16)
}

// describe writes t's shape: a struct's fields (name, JSON name, type)
// and, once each, the structs they hold.
func describe(b *strings.Builder, t reflect.Type, seen map[reflect.Type]bool) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || seen[t] {
		return
	}
	seen[t] = true
	b.WriteString(t.Name() + "{")
	for i := range t.NumField() {
		f := t.Field(i)
		b.WriteString(f.Name + " " + f.Tag.Get("json") + " " + f.Type.String() + ";")
	}
	b.WriteString("}")
	for i := range t.NumField() {
		describe(b, t.Field(i).Type, seen)
	}
}
