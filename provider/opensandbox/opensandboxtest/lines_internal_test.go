package opensandboxtest

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// lines frames output as the real execd does (one event a line, without
// its ending; "\n" for an empty line; "\r" ends a line; "\r\n" is one end),
// each case checked against the real execd.
func TestLines(t *testing.T) {
	for in, want := range map[string][]string{
		"":                nil,
		"a\nb\n\nc\n":     {"a", "b", "\n", "c"},
		"\n\nx":           {"\n", "\n", "x"},
		"abc":             {"abc"},
		"a\rb\r\nc\n":     {"a", "b", "c"},
		"a\r\rb":          {"a", "\n", "b"},
		"\r\n\r\n":        {"\n", "\n"},
		"x\r\n\ny":        {"x", "\n", "y"},
		"\xff\x00z\n":     {"\xff\x00z"},
		"last\nno end\r ": {"last", "no end", " "},
	} {
		if diff := cmp.Diff(want, lines(in)); diff != "" {
			t.Errorf("lines(%q) (-want +got):\n%s", in, diff)
		}
	}
}

// Paths expand as in the real execd: a defined name, an undefined one is an
// error, $ before anything but a name or a special character stays.
func TestExpandPath(t *testing.T) {
	for in, want := range map[string]string{
		"/w/cost$HOME.txt": "/w/cost/root.txt",
		"/w/${HOME}x":      "/w//rootx",
		"/w/price$":        "/w/price$",
		"/w/a$.txt":        "/w/a$.txt",
		"/w/$1":            "/w/",
		"/w/$X":            "/w/x-value",
		"/w/$NOPE":         "error",
		// A name is letters, digits and _, not starting with a digit:
		// the ends of each range are names (undefined: an error), the
		// characters just outside them are not (they expand to nothing).
		"/w/$a": "error", "/w/$z": "error", "/w/$A": "error", "/w/$Z": "error", "/w/$_": "error",
		"/w/${x0}": "error", "/w/${x9}": "error",
		"/w/${x`}": "/w/", "/w/${x{}": "/w/", "/w/${x@}": "/w/", "/w/${x[}": "/w/",
		"/w/${x/}": "/w/", "/w/${x:}": "/w/", "/w/${0x}": "/w/",
	} {
		got, err := expandPath(in, map[string]string{"X": "x-value"})
		if err != nil {
			got = "error"
		}
		if got != want {
			t.Errorf("expandPath(%q) = %q (%v), want %q", in, got, err, want)
		}
	}
}
