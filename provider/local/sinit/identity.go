package sinit

import (
	"embed"
	"fmt"
	"hash"
	"hash/fnv"
	"io/fs"
	"reflect"
	"strconv"
	"strings"
)

// sources are this package's own files: Identity hashes its code (see
// hashSources), so that a separate init built from other sources is told
// apart even when its messages have the same shape.
//
//go:embed *.go
var sources embed.FS

// ProtocolVersion counts the changes to what the server and an init
// expect of each other that neither the messages' shape nor the init's
// code shows (a new meaning of a field on the server's side): bump it
// with any such change. Identity covers the shape and the code itself.
const ProtocolVersion = 1

// Identity names the init protocol this build speaks: ProtocolVersion and
// a fingerprint of the messages (each field's name, type and JSON name),
// the descriptors, stage names and mount kinds, and of the init's code
// itself (this package's sources but its tests): an init that speaks the
// same messages but drops fewer privileges, or sets other limits, is
// another init. The provider uses a
// separate init binary only if it answers the server's own Identity (see
// StageIdentity): one built from other sources is refused, never run.
func Identity() string { return identity(sources) }

// identity is Identity with src as the package's sources.
func identity(src fs.FS) string {
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
	hashSources(h, src)
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

// hashSources writes into h the name and content of each Go file of src
// but its tests, in name order.
func hashSources(h hash.Hash, src fs.FS) {
	names, _ := fs.Glob(src, "*.go")
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		b, err := fs.ReadFile(src, name)
		if err != nil {
			panic(fmt.Sprintf("sinit: the embedded %s: %v", name, err))
		}
		fmt.Fprintf(h, "%s %d\n", name, len(b))
		h.Write(b)
	}
}
