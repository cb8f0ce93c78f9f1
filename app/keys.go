package app

import (
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"go.yaml.in/yaml/v3"
)

// keyError is a configuration file's problem at one key: its line and a
// message naming the key's dotted path.
type keyError struct {
	line int
	msg  string
}

func (e *keyError) Error() string { return fmt.Sprintf("%d: %s", e.line, e.msg) }

// decodeNode decodes a YAML node into v, walking structs key by key so that
// an unknown key or a value of the wrong type is reported by its dotted path
// (yaml's own messages name Go types). Keys are found by their yaml tags:
// a new key needs no code here.
func decodeNode(n *yaml.Node, v reflect.Value, path string) error {
	switch n.Kind {
	case 0:
		return nil // an empty file
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil
		}
		return decodeNode(n.Content[0], v, path)
	case yaml.AliasNode:
		return decodeNode(n.Alias, v, path)
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil // "key:" with nothing keeps the default
	}
	if err := uniqueKeys(n, path); err != nil {
		return err
	}
	if v.Kind() != reflect.Struct {
		if err := n.Decode(v.Addr().Interface()); err != nil {
			return &keyError{n.Line, fmt.Sprintf("%s: want %s, got %s", path, wantOf(v.Type()), gotOf(n))}
		}
		return nil
	}
	if n.Kind != yaml.MappingNode {
		what := "a mapping of keys"
		if path == "" {
			return &keyError{n.Line, fmt.Sprintf("the file must be %s, not %s", what, gotOf(n))}
		}
		return &keyError{n.Line, fmt.Sprintf("%s: want %s, got %s", path, what, gotOf(n))}
	}
	fields := fieldsOf(v.Type())
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		idx, ok := fields[k.Value]
		if !ok {
			return &keyError{k.Line, unknownKey(join(path, k.Value), fields, path)}
		}
		if err := decodeNode(val, v.FieldByIndex(idx), join(path, k.Value)); err != nil {
			return err
		}
	}
	return nil
}

// uniqueKeys refuses a mapping that gives a key twice, which would lose
// the first value without a word.
func uniqueKeys(n *yaml.Node, path string) error {
	if n.Kind != yaml.MappingNode {
		return nil
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if first, dup := seen[k.Value]; dup {
			return &keyError{k.Line, fmt.Sprintf("%s is given twice (first on line %d)", join(path, k.Value), first)}
		}
		seen[k.Value] = k.Line
	}
	return nil
}

func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// fieldsOf maps a struct's yaml key names to their field indexes.
func fieldsOf(t reflect.Type) map[string][]int {
	out := map[string][]int{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = []int{i}
	}
	return out
}

// unknownKey words an unknown key, with the nearest known one: a sibling
// spelt almost alike, else a key of that name elsewhere.
func unknownKey(key string, siblings map[string][]int, prefix string) string {
	name := key[strings.LastIndexByte(key, '.')+1:]
	best, bestD := "", 0
	for s := range siblings {
		d := editDistance(name, s)
		if d <= max(2, len(name)/3) && (best == "" || d < bestD || d == bestD && s < best) {
			best, bestD = s, d
		}
	}
	if best != "" {
		return fmt.Sprintf("unknown key %q (did you mean %q?)", key, join(prefix, best))
	}
	for _, l := range leaves() {
		if strings.HasSuffix(l.path, "."+name) || l.path == name {
			return fmt.Sprintf("unknown key %q (did you mean %q?)", key, l.path)
		}
	}
	return fmt.Sprintf("unknown key %q", key)
}

// editDistance is Levenshtein's distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// wantOf words what a key of type t takes.
// durationType is time.Duration, written as 30s, 5m or 6h.
var durationType = reflect.TypeOf(time.Duration(0))

func wantOf(t reflect.Type) string {
	if t == durationType {
		return "a duration (30s, 5m, 6h)"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.Map:
		return fmt.Sprintf("a mapping of key: %s", strings.TrimPrefix(strings.TrimPrefix(wantOf(t.Elem()), "a "), "an "))
	case reflect.Slice:
		return "a list"
	case reflect.Interface:
		return "a value"
	}
	return t.String()
}

// gotOf words what a node holds.
func gotOf(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return strconv.Quote(n.Value)
}

// flagType is the value placeholder -h shows for a key.
func flagType(t reflect.Type) string {
	if t == durationType {
		return "duration"
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Int, reflect.Int64:
		return "int"
	case reflect.Float64:
		return "number"
	case reflect.Bool:
		return "" // a bool flag takes no value (-key=false to unset)
	case reflect.Map:
		return "key=value"
	}
	return "value"
}

// defaultOf words a key's value in Defaults ("" for the zero value).
func defaultOf(l leaf) string {
	d := Defaults()
	v := reflect.ValueOf(&d).Elem().FieldByIndex(l.index)
	if v.IsZero() {
		return ""
	}
	switch v.Kind() {
	case reflect.String:
		return strconv.Quote(v.String())
	case reflect.Map:
		keys := make([]string, 0, v.Len())
		for _, k := range v.MapKeys() {
			keys = append(keys, fmt.Sprintf("%v=%v", k, v.MapIndex(k)))
		}
		sort.Strings(keys)
		return strings.Join(keys, ",")
	}
	return fmt.Sprint(v.Interface())
}

// commandUsage is one line per subcommand, for -h.
func commandUsage() map[string]string {
	return map[string]string{
		"serve":    "run the server (what runs when no command is named)",
		"sweep":    "with the server stopped, list (with -reap remove) the sandboxes and snapshots no checkpoint or tombstone accounts for",
		"swebench": "swebench prepare -dataset ROWS.jsonl [-parallel N]: build and validate every instance ahead of time, with a progress bar, and print a table",
	}
}

// writeUsage is -h: the commands, the flags of the binary itself, then
// every configuration key with its type, meaning and default.
func writeUsage(w io.Writer, own [][3]string) {
	fmt.Fprintln(w, "usage: server [command] [-config FILE] [-log-format text|json] [-log-level LEVEL] [-<key> value ...]")
	fmt.Fprintln(w, "\ncommands:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	cu := commandUsage()
	for _, name := range slices.Sorted(maps.Keys(commands())) {
		fmt.Fprintf(tw, "  %s\t%s\n", name, cu[name])
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "\nflags:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, f := range own {
		fmt.Fprintf(tw, "  -%s\t%s\t%s\n", f[0], f[1], f[2])
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "\nconfiguration keys (YAML keys of -config FILE, and flags named by their dotted path; flags win):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, k := range Reference() {
		meaning := k.Meaning
		if k.Default != "" {
			meaning += " (default " + k.Default + ")"
		}
		fmt.Fprintf(tw, "  -%s\t%s\t%s\n", k.Key, k.Type, meaning)
	}
	_ = tw.Flush()
}
