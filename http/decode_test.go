package http

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// outcome is what a caller sees of a decode: the value, and the status,
// code and detail of the error.
func outcome(v any, err error) string {
	if err == nil {
		if t, ok := v.(*typedSeed); ok && t != nil {
			return fmt.Sprintf("ok %q %s %+v %s %+v", t.ResourcesSessionID, t.EpisodeID, t.TaskID, t.TaskData, t.episode)
		}
		return fmt.Sprintf("ok %v", v)
	}
	status, code, detail := classify(err)
	return fmt.Sprintf("error %d %s %s", status, code, detail)
}

// bodyTemplates are well-formed bodies of the session routes: typed and
// legacy seeds, close bodies, episode ids.
var bodyTemplates = []string{
	`{"resources_session_id":"s-1","episode_id":{"rollout_id":"r1","attempt":2},"task_id":{"taskset":"ts","task_id":"t1"},"task_data":{"a":[1,2,{"b":"c"}],"d":null}}`,
	`{ "resources_session_id" : "abc.D:e-f" , "episode_id" : "r9-a3" , "task_id" : { "taskset" : "x" , "task_id" : "y" } , "task_data" : { } }`,
	`{"task_data":{"x":"}"},"task_id":{"task_id":"t","taskset":"s"},"episode_id":{"attempt":0,"rollout_id":"r"},"resources_session_id":"z"}`,
	`{"resources_session_id":"s","episode_id":null,"task_id":null,"task_data":[]}`,
	`{"question":"what is 1+1?","expected":"2","meta":{"k":[true,false,null,1.5e3]}}`,
	`{}`,
	``,
	`{"resources_session_id":"s-2"}`,
	`{"resources_session_id":null,"episode_id":"r-a1"}`,
	`{"resources_session_id":"s-3","episode_id":{"rollout_id":"r","attempt":-1,"extra":[{}]}}`,
	`{"other":1,"resources_session_id":"s","episode_id":{"rollout_id":"r-a2","attempt":1}}`,
	`{"episode_id":{"rollout_id":"r","attempt":123456789012345678901}}`,
	`{"episode_id":{"rollout_id":"r","attempt":1.0}}`,
	`{"rollout_id":"r","attempt":123456789012345678901}`,
	`{"rollout_id":"r-a1","attempt":999999999999999999}`,
	`{"rollout_id":"r","attempt":-0,"note":"x"}`,
	`{"rollout_id":"bad id!","attempt":1}`,
	`{"resources_session_id":"s","task_id":{"taskset":"a","task_id":"b"},"task_data":{}}`,
	`{"resources_session_id":7,"episode_id":"r-a1","task_id":{"taskset":"a","task_id":"b"},"task_data":{}}`,
	`"r1-a2"`, `"bad key!"`,
	`{"responses_create_params":{"input":[{"role":"user","content":"<b>&</b>"}]},"response":{"output":[]},"a<b":1,"\u2028":2}`,
	`{"a":1,"b":{"c":[1,2]},"a":3}`,
	`[1,2]`, `"str"`, `null`, `12`,
}

// pieces are what the mutations splice in: escapes, folded and repeated
// keys, wrong types, bad bytes, whitespace JSON does not know.
var pieces = []string{
	`\u0041`, `\"`, `\\`, `\n`, `"`, `{`, `}`, `[`, `]`, `,`, `:`, ` `, "\t", "\f", "\v", "\u00a0", "\x00", "\xff", "é",
	`null`, `true`, `1`, `-0`, `1e2`, `0.5`, `"x"`, `{}`, `[]`,
	`"resources_session_id":"d",`, `"Resources_Session_ID":"d",`, `"reſources_session_id":"d",`,
	`"episode_id":"r-a1",`, `"Episode_ID":{"rollout_id":"q"},`, `"task_id":{"taskset":"a","task_id":"b"},`,
	`"task_data":{},`, `"rollout_id":"r",`, `"ROLLOUT_ID":"r",`, `"attempt":3,`, `"attempt":"3",`, `"taſk_id":1,`,
	`"taskset":"u",`, `"TaskSet":"u",`, `"x":1,`, `"resources_session_id":7,`, `"resources\u005fsession_id":"e",`,
	"\x80", "\u212a", `"Kx":1,`,
}

// members are whole members, spliced after an opening brace.
var members = []string{
	`"resources_session_id":"d",`, `"Resources_Session_ID":"d",`, `"reſources_session_id":"d",`, `"resources_session_id":null,`,
	`"episode_id":"r-a1",`, `"episode_id":{"rollout_id":"q","attempt":1},`, `"Episode_ID":{"rollout_id":"q"},`, `"episode_id":7,`,
	`"task_id":{"taskset":"a","task_id":"b"},`, `"task_id":{"taskset":"a","task_id":"b","x":1},`, `"task_id":{"Taskset":"a"},`, `"task_id":[],`,
	`"task_data":{},`, `"task_data":"x",`, `"rollout_id":"r",`, `"rollout_id":"\u0072",`, `"ROLLOUT_ID":"r",`, `"attempt":3,`, `"attempt":"3",`,
	`"attempt":1e1,`, `"attempt":-12,`, `"taſk_id":1,`, `"taskset":"u",`, `"task_id":"v",`, `"x":{"y":[1,{"z":"}"}]},`, `"\u0078":1,`,
	`"resources_session_id":"a\u0062",`, "\"resources_session_id\":\"\xff\",", `"resources_session_id":"é",`, "\"rollout_id\":\"\xc3\",",
}

// mutants returns n bodies: the templates, then each with a few random
// splices, deletions and repetitions.
func mutants(seed uint64, n int) []string {
	rng := rand.New(rand.NewPCG(seed, 31))
	out := append([]string(nil), bodyTemplates...)
	for len(out) < n {
		b := bodyTemplates[rng.IntN(len(bodyTemplates))]
		for range 1 + rng.IntN(2) {
			i := 0
			if len(b) > 0 {
				i = rng.IntN(len(b) + 1)
			}
			switch rng.IntN(8) {
			case 4, 5, 6, 7:
				// A member after an opening brace: mostly still valid.
				if n := strings.Count(b, "{"); n > 0 {
					k := -1
					for range 1 + rng.IntN(n) {
						k += 1 + strings.IndexByte(b[k+1:], '{')
					}
					b = b[:k+1] + members[rng.IntN(len(members))] + b[k+1:]
				}
			case 0, 1:
				b = b[:i] + pieces[rng.IntN(len(pieces))] + b[i:]
			case 2:
				if i < len(b) {
					b = b[:i] + b[i+1:]
				}
			case 3:
				if j := i + rng.IntN(12); j <= len(b) {
					b = b[:j] + b[i:j] + b[j:]
				}
			}
		}
		out = append(out, b)
	}
	return out
}

// The hand-read session bodies decode as encoding/json decodes them: the
// same value, or the same status, code and detail, for every body, well
// formed or not; a verify request splits into the same fields.
func TestSessionBodiesDecodeAsEncodingJSONDoes(t *testing.T) {
	// 4,000 bodies: of hand-made mutants of the readers (a condition
	// negated or dropped, a check of a value's type skipped, strict and
	// lax objects swapped) each that changes an answer fails on one of the
	// first 420 (30,000 cost the package seconds of CPU under -race); those
	// that only make a reader decline fail the counts below.
	bodies := mutants(1, 4000)
	// How many bodies each reader carried: a reader that declines what it
	// should read changes no result, only the speed.
	var read struct{ seeds, typed, closes, episodes, fields int }
	for _, b := range bodies {
		body := []byte(b)
		ts, terr := parseTyped(body, true)
		ws, werr := parseTyped(body, false)
		if got, want := outcome(ts, terr), outcome(ws, werr); got != want {
			t.Fatalf("seed %q:\n got %s\nwant %s", b, got, want)
		}
		tc, cerr := decodeClose(body, true)
		wc, wcerr := decodeClose(body, false)
		if got, want := outcome(closeOutcome(tc), cerr), outcome(closeOutcome(wc), wcerr); got != want {
			t.Fatalf("close %q:\n got %s\nwant %s", b, got, want)
		}
		e, ok, err := parseEpisode(body, true)
		we, wok, werr2 := parseEpisode(body, false)
		if got, want := outcome(fmt.Sprint(e, ok), err), outcome(fmt.Sprint(we, wok), werr2); got != want {
			t.Fatalf("episode %q:\n got %s\nwant %s", b, got, want)
		}
		keys, vals, ferr := fields(body, true)
		wkeys, wvals, wferr := fields(body, false)
		if got, want := fmt.Sprintf("%q %q %v", keys, vals, ferr), fmt.Sprintf("%q %q %v", wkeys, wvals, wferr); got != want {
			t.Fatalf("verify fields of %q:\n got %s\nwant %s", b, got, want)
		}
		if !json.Valid(body) {
			continue
		}
		if ts, ok := readTypedSeed(body); ok {
			read.seeds++
			if ts != nil {
				read.typed++
			}
		}
		if _, ok := readClose(body); ok {
			read.closes++
		}
		if _, ok := readEpisode(body); ok {
			read.episodes++
		}
		if _, _, ok := readFields(body); ok {
			read.fields++
		}
	}
	n := len(bodies)
	if read.seeds < n/10 || read.typed < n/50 || read.closes < n/10 || read.episodes < n/10 || read.fields < n/10 {
		t.Fatalf("of %d bodies the readers read %+v", n, read)
	}
}

func closeOutcome(r closeRequest) string {
	id := "<nil>"
	if r.ResourcesSessionID != nil {
		id = fmt.Sprintf("%q", *r.ResourcesSessionID)
	}
	return id + " " + strings.TrimSpace(string(r.EpisodeID))
}

// A close's reply is what json.Marshal writes for its map.
func TestClosedReplyAsMarshalWritesIt(t *testing.T) {
	for _, id := range []string{"", "s-1", `a"b\c`, "<&>", "\u2028", "\xff"} {
		var want any = map[string]string{"resources_session_id": id}
		if id == "" {
			want = map[string]bool{"closed": true}
		}
		w, err := json.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		got, err := closedReply(id).AppendJSON([]byte("x"))
		if err != nil || string(got) != "x"+string(w) {
			t.Errorf("%q: %s, %v; want x%s", id, got, err, w)
		}
	}
}

// A verify request of more members than the reader takes is split as
// encoding/json splits it.
func TestManyVerifyFields(t *testing.T) {
	var b strings.Builder
	b.WriteString("{")
	for i := range maxReadFields + 1 {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, "%q:%d", fmt.Sprint("k", i), i)
	}
	b.WriteString("}")
	keys, vals, err := fields([]byte(b.String()), true)
	if err != nil || len(keys) != maxReadFields+1 || string(vals[maxReadFields]) != fmt.Sprint(maxReadFields) {
		t.Fatalf("%d keys, %v", len(keys), err)
	}
}

// BenchmarkVerifyFields splits a Gym-sized verify request (a conversation of
// 40 turns) by hand and by encoding/json, in one run.
func BenchmarkVerifyFields(b *testing.B) {
	var turns []string
	for i := range 40 {
		turns = append(turns, fmt.Sprintf(`{"role":"user","content":"turn %d: %s"}`, i, strings.Repeat("lorem ipsum ", 40)))
	}
	body := []byte(`{"responses_create_params":{"input":[` + strings.Join(turns, ",") + `]},"response":{"id":"r","output":[` + strings.Join(turns, ",") + `]},"expected_notes":["one"]}`)
	for _, fast := range []bool{true, false} {
		b.Run(fmt.Sprint("fast=", fast), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := fields(body, fast); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestReadersCarryTheSimpleBodies: the common bodies (no escapes, no
// repeated or folded keys) are read by hand, not left to encoding/json: a
// legacy seed with fields, a typed seed, a named close, an episode id, a
// verify request.
func TestReadersCarryTheSimpleBodies(t *testing.T) {
	type carried struct{ Legacy, LegacyIsLegacy, Typed, Close, Episode, Fields bool }
	var got carried
	var ts *typedSeed
	ts, got.Legacy = readTypedSeed([]byte(`{"question":"what is 1+1?","expected":"2"}`))
	got.LegacyIsLegacy = ts == nil
	ts, got.Typed = readTypedSeed([]byte(bodyTemplates[0]))
	got.Typed = got.Typed && ts != nil
	_, got.Close = readClose([]byte(`{"resources_session_id":"s-1","episode_id":{"rollout_id":"r","attempt":1}}`))
	_, got.Episode = readEpisode([]byte(`{"rollout_id":"r","attempt":1}`))
	_, _, got.Fields = readFields([]byte(`{"response":{"output":[]},"reward_hint":1}`))
	if diff := cmp.Diff(carried{true, true, true, true, true, true}, got); diff != "" {
		t.Errorf("bodies read by hand (-want +got):\n%s", diff)
	}
}
