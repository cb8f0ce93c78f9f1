package records

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var part = Participant{Kind: KindResources, Instance: "notes"}

func lines(ss ...string) [][]byte {
	out := make([][]byte, len(ss))
	for i, s := range ss {
		out[i] = []byte(s)
	}
	return out
}

func digest(b string) string { s := sha256.Sum256([]byte(b)); return hex.EncodeToString(s[:]) }

func readAll(t *testing.T, fsys FS, name string) string {
	t.Helper()
	f, err := fsys.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The files are where Gym puts them, named after the digest of exactly the
// lines written, and the manifest is Gym's: sorted keys, indent 1.
func TestWriteLayoutAndManifestBytes(t *testing.T) {
	for _, tc := range []struct {
		name string
		fsys func(t *testing.T) (FS, string)
	}{
		{"memfs", func(*testing.T) (FS, string) { return NewMemFS(), "/ck/c1" }},
		{"os", func(t *testing.T) (FS, string) { return OS{}, filepath.Join(t.TempDir(), "c1") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fsys, ck := tc.fsys(t)
			w := Writer{FS: fsys, Participant: part}
			m, err := w.Write(ck, "c1", lines(`{"a": 1}`, `{"b": "é"}`), nil)
			if err != nil {
				t.Fatal(err)
			}
			body := "{\"a\": 1}\n{\"b\": \"é\"}\n"
			sum := digest(body)
			want := Manifest{SchemaVersion: 1, Kind: "resources", Instance: "notes", CheckpointID: "c1",
				RecordsFile: "records-" + sum + ".jsonl", RecordsSHA256: sum, RecordCount: 2}
			if diff := cmp.Diff(want, m); diff != "" {
				t.Fatalf("manifest (-want +got):\n%s", diff)
			}
			dir := path.Join(ck, "gym", "resources", "notes")
			if got := readAll(t, fsys, path.Join(dir, m.RecordsFile)); got != body {
				t.Fatalf("records file %q, want %q", got, body)
			}
			wantManifest := "{\n \"checkpoint_id\": \"c1\",\n \"instance\": \"notes\",\n \"kind\": \"resources\",\n" +
				" \"record_count\": 2,\n \"records_file\": \"records-" + sum + ".jsonl\",\n \"records_sha256\": \"" + sum +
				"\",\n \"schema_version\": 1\n}"
			if got := readAll(t, fsys, path.Join(dir, ManifestName)); got != wantManifest {
				t.Fatalf("manifest bytes:\n%s\nwant:\n%s", got, wantManifest)
			}
			if mem, ok := fsys.(*MemFS); ok {
				// No temporary file is left.
				want := []string{path.Join(dir, ManifestName), path.Join(dir, m.RecordsFile)}
				if diff := cmp.Diff(want, mem.Files()); diff != "" {
					t.Fatalf("files (-want +got):\n%s", diff)
				}
			} else {
				ents, _ := os.ReadDir(dir)
				if len(ents) != 2 {
					t.Fatalf("directory holds %d entries, want the records file and the manifest", len(ents))
				}
			}
			var seen []string
			got, err := Read(fsys, ck, part, func(line []byte) error { seen = append(seen, string(line)); return nil })
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("read manifest (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{`{"a": 1}`, `{"b": "é"}`}, seen); diff != "" {
				t.Fatalf("read lines (-want +got):\n%s", diff)
			}
		})
	}
}

// A second write of the same records returns the manifest there; another
// commit into the directory is refused and leaves no file of its own.
func TestWriteIsIdempotentAndCreateOnly(t *testing.T) {
	fsys := NewMemFS()
	w := Writer{FS: fsys, Participant: part}
	first, err := w.Write("/ck", "c1", lines(`{"a": 1}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	again, err := w.Write("/ck", "c1", lines(`{"a": 1}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(first, again); diff != "" {
		t.Fatalf("repeat (-first +again):\n%s", diff)
	}
	before := fsys.Files()
	for _, tc := range []struct {
		name  string
		id    string
		lines [][]byte
	}{
		{"other records", "c1", lines(`{"a": 2}`)},
		{"other checkpoint id", "c2", lines(`{"a": 1}`)},
	} {
		if _, err := w.Write("/ck", tc.id, tc.lines, nil); !errors.Is(err, ErrInvalidState) || !strings.Contains(err.Error(), "different commit") {
			t.Fatalf("%s: err = %v, want a different commit refused", tc.name, err)
		}
		if diff := cmp.Diff(before, fsys.Files()); diff != "" {
			t.Fatalf("%s: files changed (-before +after):\n%s", tc.name, diff)
		}
	}
}

// A stopped write publishes nothing and leaves nothing.
func TestStoppedWritePublishesNothing(t *testing.T) {
	fsys := NewMemFS()
	var stop Stop
	stop.Stop()
	_, err := Writer{FS: fsys, Participant: part}.Write("/ck", "c1", lines(`{"a": 1}`), &stop)
	if !errors.Is(err, ErrStopped) {
		t.Fatalf("err = %v, want ErrStopped", err)
	}
	if files := fsys.Files(); len(files) != 0 {
		t.Fatalf("files left: %v", files)
	}
	// With no records the check before publishing still stops it.
	if _, err := (Writer{FS: fsys, Participant: part}).Write("/ck", "c1", nil, &stop); !errors.Is(err, ErrStopped) {
		t.Fatalf("empty write: err = %v, want ErrStopped", err)
	}
	if files := fsys.Files(); len(files) != 0 {
		t.Fatalf("files left: %v", files)
	}
}

func TestUnsafeParticipantNames(t *testing.T) {
	for _, p := range []Participant{{"resources", "../x"}, {"", "notes"}, {"resources", ".hidden"}, {"re/s", "n"}} {
		if _, err := (Writer{FS: NewMemFS(), Participant: p}).Write("/ck", "c1", nil, nil); !errors.Is(err, ErrInvalidState) {
			t.Errorf("%+v: err = %v, want ErrInvalidState", p, err)
		}
		if _, err := Read(NewMemFS(), "/ck", p, nil); !errors.Is(err, ErrInvalidState) {
			t.Errorf("read %+v: err = %v, want ErrInvalidState", p, err)
		}
	}
}

// Every check of the read refuses what a writer did not leave, before the
// caller sees a record it could act on.
func TestReadVerification(t *testing.T) {
	dir := "/ck/gym/resources/notes"
	body := "{\"a\": 1}\n"
	sum := digest(body)
	good := map[string]any{"schema_version": 1, "kind": "resources", "instance": "notes", "checkpoint_id": "c1",
		"records_file": "records-" + sum + ".jsonl", "records_sha256": sum, "record_count": 1}
	with := func(k string, v any) map[string]any {
		m := maps.Clone(good)
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	for _, tc := range []struct {
		name     string
		manifest any // nil: none
		records  string
		want     string
	}{
		{"ok", good, body, ""},
		{"legacy records.jsonl", with("records_file", "records.jsonl"), body, "legacy"},
		{"no manifest", nil, body, "missing manifest"},
		{"manifest not an object", []int{1}, body, "is not a manifest"},
		{"schema 2", with("schema_version", 2), body, "unsupported schema"},
		{"no schema", with("schema_version", nil), body, "unsupported schema"},
		{"another kind", with("kind", "agent"), body, "belongs to agent/notes"},
		{"another instance", with("instance", "other"), body, "belongs to resources/other"},
		{"checkpoint id not a string", with("checkpoint_id", 7), body, "names no checkpoint"},
		{"records file outside", with("records_file", "../records-"+sum+".jsonl"), body, "invalid records file"},
		{"records file not a string", with("records_file", 3), body, "invalid records file"},
		{"digest mismatch", good, "{\"a\": 2}\n", "does not match its manifest digest"},
		{"count mismatch", with("record_count", 2), body, "expects 2 records, found 1"},
		{"count as text", with("record_count", "1"), body, `expects "1" records, found 1`},
		{"not JSON", with("records_sha256", digest("{\"a\"\n")), "{\"a\"\n", "not JSON"},
		{"records file missing", with("records_file", "records-"+digest("x")+".jsonl"), body, "cannot read"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fsys := NewMemFS()
			records := "records-" + sum + ".jsonl"
			if tc.name == "legacy records.jsonl" {
				records = "records.jsonl"
			}
			if err := fsys.WriteFile(path.Join(dir, records), []byte(tc.records)); err != nil {
				t.Fatal(err)
			}
			if tc.manifest != nil {
				b, err := marshalPythonIndent1(tc.manifest)
				if err != nil {
					t.Fatal(err)
				}
				if err := fsys.WriteFile(path.Join(dir, ManifestName), b); err != nil {
					t.Fatal(err)
				}
			}
			n := 0
			_, err := Read(fsys, "/ck", part, func([]byte) error { n++; return nil })
			switch {
			case tc.want == "" || tc.want == "legacy":
				if err != nil {
					t.Fatalf("err = %v", err)
				}
			case !errors.Is(err, ErrInvalidState) || !strings.Contains(err.Error(), tc.want):
				t.Fatalf("err = %v, want ErrInvalidState saying %q", err, tc.want)
			}
			if tc.name == "no manifest" && !errors.Is(err, ErrNoManifest) {
				t.Fatalf("err = %v, want ErrNoManifest", err)
			}
		})
	}
}

// A record the caller refuses ends the read with the caller's error.
func TestReadStopsOnCallerError(t *testing.T) {
	fsys := NewMemFS()
	if _, err := (Writer{FS: fsys, Participant: part}).Write("/ck", "c1", lines(`{"a": 1}`, `{"a": 2}`), nil); err != nil {
		t.Fatal(err)
	}
	bad := errors.New("bad record")
	n := 0
	_, err := Read(fsys, "/ck", part, func([]byte) error { n++; return bad })
	if !errors.Is(err, bad) || !errors.Is(err, ErrInvalidState) || n != 1 {
		t.Fatalf("err = %v after %d records, want the caller's error after 1", err, n)
	}
}

// The last line may lack its newline (its bytes still count).
func TestReadLastLineWithoutNewline(t *testing.T) {
	var got []string
	h := sha256.New()
	n, err := readLines(bytes.NewReader([]byte("{}\n[1]")), h, func(l []byte) error { got = append(got, string(l)); return nil })
	if err != nil || n != 2 {
		t.Fatalf("n = %d, err = %v", n, err)
	}
	if diff := cmp.Diff([]string{"{}", "[1]"}, got); diff != "" {
		t.Fatal(diff)
	}
	if hex.EncodeToString(h.Sum(nil)) != digest("{}\n[1]") {
		t.Fatal("the digest does not cover every byte read")
	}
}
