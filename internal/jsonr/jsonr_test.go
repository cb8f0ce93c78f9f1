package jsonr

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// member is a key as written and its value's bytes.
type member struct{ Key, Value string }

// decoded lists data's members as encoding/json's decoder reads them, for
// an object whose keys hold no escape.
func decoded(t *testing.T, data []byte) []member {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	if _, err := dec.Token(); err != nil {
		t.Fatal(err)
	}
	var out []member
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, member{k.(string), string(v)})
	}
	return out
}

// value writes a random JSON value: strings with escapes and braces,
// nested objects and arrays, numbers and literals.
func value(rng *rand.Rand, depth int) string {
	switch n := rng.IntN(7); {
	case n == 0 && depth < 3:
		s := "{"
		for i := range rng.IntN(3) {
			if i > 0 {
				s += " ,\n"
			}
			s += strconv.Quote("k"+strconv.Itoa(i)) + "\t:" + value(rng, depth+1)
		}
		return s + "}"
	case n == 1 && depth < 3:
		s := "[ "
		for i := range rng.IntN(3) {
			if i > 0 {
				s += ","
			}
			s += value(rng, depth+1)
		}
		return s + "]"
	case n == 2:
		return []string{`"a\"}b"`, `"\\"`, `"]{,:"`, `""`, `"é"`}[rng.IntN(5)]
	case n == 3:
		return []string{"true", "false", "null"}[rng.IntN(3)]
	default:
		return []string{"0", "-12", "1.5e+3", "7E-1", "123456789012345678"}[rng.IntN(5)]
	}
}

// Members reads each member of a valid object as encoding/json's decoder
// does, whatever the whitespace and nesting.
func TestMembersAsTheDecoderReadsThem(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 3000 {
		data := "\r {"
		for i := range rng.IntN(5) {
			if i > 0 {
				data += " , "
			}
			data += `"m` + strconv.Itoa(i) + `" : ` + value(rng, 0)
		}
		data += "}\n"
		if !json.Valid([]byte(data)) {
			t.Fatalf("the generator wrote invalid JSON: %s", data)
		}
		var got []member
		if !Members([]byte(data), func(k, v []byte) bool {
			got = append(got, member{string(k), string(v)})
			return true
		}) {
			t.Fatalf("%s: not read", data)
		}
		if diff := cmp.Diff(decoded(t, []byte(data)), got); diff != "" {
			t.Fatalf("%s (-decoder +Members):\n%s", data, diff)
		}
	}
}

func TestMembersDeclines(t *testing.T) {
	for _, data := range []string{``, "  \n", `[1]`, `"s"`, `1`, `null`, `{"a\u0062":1}`, `{"a":1,"\"":2}`} {
		if Members([]byte(data), func(_, _ []byte) bool { return true }) {
			t.Errorf("%s: read", data)
		}
	}
	calls := 0
	if Members([]byte(`{"a":1,"b":2}`), func(_, _ []byte) bool { calls++; return false }) || calls != 1 {
		t.Errorf("a member refused: read on (%d calls)", calls)
	}
}

func TestStringIntFields(t *testing.T) {
	type str struct {
		S  string
		OK bool
	}
	var gotS []str
	for _, v := range []string{`"abc"`, `""`, `"a\"b"`, `"\u0041"`, "\"\xff\"", `"é"`, `1`, `null`, `"`} {
		s, ok := String([]byte(v))
		gotS = append(gotS, str{string(s), ok})
	}
	wantS := []str{{"abc", true}, {"", true}, {"", false}, {"", false}, {"", false}, {"é", true}, {"", false}, {"", false}, {"", false}}
	if diff := cmp.Diff(wantS, gotS); diff != "" {
		t.Errorf("String (-want +got):\n%s", diff)
	}
	type num struct {
		N  int
		OK bool
	}
	var gotN []num
	for _, v := range []string{"0", "-0", "42", "-7", "999999999999999999", "1000000000000000000", "1.0", "1e2", "-", "", `"1"`} {
		n, ok := Int([]byte(v))
		gotN = append(gotN, num{n, ok})
	}
	wantN := []num{{0, true}, {0, true}, {42, true}, {-7, true}, {999999999999999999, true}, {0, false}, {0, false}, {0, false}, {0, false}, {0, false}, {0, false}}
	if diff := cmp.Diff(wantN, gotN); diff != "" {
		t.Errorf("Int (-want +got):\n%s", diff)
	}
	type field struct {
		I  int
		OK bool
	}
	var gotF []field
	for _, k := range []string{"task_id", "taskset", "TaskSet", "other", "taſk_id", "x\x80", "task_i", "task_idd", "TASKSET", "ZONE", "zone"} {
		i, ok := Fields([]byte(k), "taskset", "task_id", "zone")
		gotF = append(gotF, field{i, ok})
	}
	wantF := []field{{1, true}, {0, true}, {-1, false}, {-1, true}, {-1, false}, {-1, false}, {-1, true}, {-1, true}, {-1, false}, {-1, false}, {2, true}}
	if diff := cmp.Diff(wantF, gotF); diff != "" {
		t.Errorf("Fields (-want +got):\n%s", diff)
	}
}

// Object hands each known member to fn by its name's index, skips or
// refuses unknown keys by strict, and declines what encoding/json would
// read otherwise: a folded key, a repeated name, a value fn refuses.
func TestObject(t *testing.T) {
	type got struct {
		OK   bool
		Read []member // index as Key, value
	}
	names := []string{"a", "b", "c"}
	for _, c := range []struct {
		data   string
		strict bool
		want   got
	}{
		{`{}`, true, got{OK: true}},
		{`{"c":3,"a":1}`, true, got{true, []member{{"2", "3"}, {"0", "1"}}}},
		{`{"a":1,"x":[1,2],"b":"s"}`, false, got{true, []member{{"0", "1"}, {"1", `"s"`}}}},
		{`{"a":1,"x":2,"b":3}`, true, got{false, []member{{"0", "1"}}}},
		{`{"A":1}`, false, got{}},
		{`{"b":1,"b":2}`, false, got{false, []member{{"1", "1"}}}},
		{`{"c":1,"a":2,"c":3}`, true, got{false, []member{{"2", "1"}, {"0", "2"}}}},
		{`{"a":1,"b":2,"c":3}`, false, got{true, []member{{"0", "1"}, {"1", "2"}, {"2", "3"}}}},
		{`{"a":"refuse","b":2}`, false, got{false, []member{{"0", `"refuse"`}}}},
		{`[{"a":1}]`, false, got{}},
	} {
		var g got
		g.OK = Object([]byte(c.data), c.strict, names, func(i int, v []byte) bool {
			g.Read = append(g.Read, member{strconv.Itoa(i), string(v)})
			return string(v) != `"refuse"`
		})
		if diff := cmp.Diff(c.want, g); diff != "" {
			t.Errorf("%s strict=%v (-want +got):\n%s", c.data, c.strict, diff)
		}
	}
	// The 64th name is told apart from the first.
	many := make([]string, 64)
	for i := range many {
		many[i] = "n" + strconv.Itoa(i)
	}
	if !Object([]byte(`{"n0":1,"n63":2}`), true, many, func(int, []byte) bool { return true }) {
		t.Error(`{"n0","n63"}: a repeat seen`)
	}
}
