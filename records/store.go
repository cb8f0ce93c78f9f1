// Package records is one participant's side of a checkpoint in the
// controller's checkpoint directory, laid out, written and verified as NeMo
// Gym's participants do it:
//
//	<checkpoint_dir>/gym/<kind>/<instance>/records-<sha256>.jsonl
//	<checkpoint_dir>/gym/<kind>/<instance>/manifest.json
//
// The records file holds one JSON object per line, in the order written,
// and is named after its digest; it is written under a temporary name,
// hashed as it is written, fsynced and renamed. The manifest that publishes
// it is created last and never replaced (a temporary file hard-linked to
// its name), then the directory is fsynced: a directory with a manifest
// never changes. Writing the same checkpoint again returns the manifest
// already there; writing another one into the directory is ErrInvalidState.
//
// A read checks the manifest (schema, kind, instance, checkpoint id, the
// records file's name) and streams the records, checking their digest and
// count against it, before the caller acts on any of them.
package records

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"path"
	"reflect"
	"regexp"
	"strconv"
	"sync"
)

// SchemaVersion is the manifest's schema_version.
const SchemaVersion = 1

// KindResources is the kind of a resources server's records.
const KindResources = "resources"

// ManifestName is the manifest's file name.
const ManifestName = "manifest.json"

var (
	// ErrInvalidState: the directory cannot be written, or what it holds
	// does not verify (no manifest, another participant's, a digest or
	// count that does not match, a line that is not JSON), or it already
	// holds another commit. Gym answers all of these 422
	// invalid_checkpoint_state.
	ErrInvalidState = errors.New("invalid checkpoint state")
	// ErrNoManifest: the participant's directory holds no manifest (wraps
	// ErrInvalidState).
	ErrNoManifest = fmt.Errorf("%w: no manifest", ErrInvalidState)
	// ErrStopped: the write was stopped before it published.
	ErrStopped = fmt.Errorf("%w: the write was stopped", ErrInvalidState)
)

var (
	namePattern        = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	recordsFilePattern = regexp.MustCompile(`^records(-[0-9a-f]{64})?\.jsonl$`)
)

// Participant names whose records a directory holds.
type Participant struct {
	Kind, Instance string
}

// Dir is the participant's directory under checkpointDir.
func (p Participant) Dir(checkpointDir string) (string, error) {
	for _, f := range []struct{ label, value string }{{"kind", p.Kind}, {"instance", p.Instance}} {
		if !namePattern.MatchString(f.value) {
			return "", fmt.Errorf("%w: participant %s %q is not a safe path component", ErrInvalidState, f.label, f.value)
		}
	}
	return path.Join(checkpointDir, "gym", p.Kind, p.Instance), nil
}

// Manifest publishes a participant's records.
type Manifest struct {
	SchemaVersion int    `json:"schema_version"`
	Kind          string `json:"kind"`
	Instance      string `json:"instance"`
	CheckpointID  string `json:"checkpoint_id"`
	RecordsFile   string `json:"records_file"`
	RecordsSHA256 string `json:"records_sha256"`
	RecordCount   int    `json:"record_count"`
}

// Stop lets a resume stop a write: once Stop has returned, the write
// publishes nothing. The writer checks it before each record without
// waiting, and again while it publishes under the lock, so Stop waits only
// for a publication already under way.
type Stop struct {
	mu      sync.Mutex
	stopped bool
}

// Stop stops the writes that use s.
func (s *Stop) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
}

func (s *Stop) check(checkpointID string) error {
	if s != nil && s.stopped {
		return fmt.Errorf("%w: checkpoint %q was resumed before its write finished", ErrStopped, checkpointID)
	}
	return nil
}

// publishing runs fn under the lock unless s was stopped.
func (s *Stop) publishing(checkpointID string, fn func() error) error {
	if s == nil {
		return fn()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check(checkpointID); err != nil {
		return err
	}
	return fn()
}

// Writer writes one participant's records into checkpoint directories.
type Writer struct {
	FS          FS
	Participant Participant
}

// Write writes lines (each one JSON record, with no newline) as the
// participant's records of checkpointID under checkpointDir, then the
// manifest that publishes them. stop may be nil.
func (w Writer) Write(checkpointDir, checkpointID string, lines [][]byte, stop *Stop) (Manifest, error) {
	m, err := w.write(checkpointDir, checkpointID, lines, stop)
	if err != nil && !errors.Is(err, ErrInvalidState) {
		err = fmt.Errorf("%w: cannot write checkpoint state under %s: %w", ErrInvalidState, checkpointDir, err)
	}
	return m, err
}

func (w Writer) write(checkpointDir, checkpointID string, lines [][]byte, stop *Stop) (Manifest, error) {
	dir, err := w.Participant.Dir(checkpointDir)
	if err != nil {
		return Manifest{}, err
	}
	if err := w.FS.MkdirAll(dir); err != nil {
		return Manifest{}, err
	}
	f, err := w.FS.CreateTemp(dir, ".records.jsonl.")
	if err != nil {
		return Manifest{}, err
	}
	temporary := f.Name()
	published := false
	defer func() {
		if !published {
			_ = w.FS.Remove(temporary)
		}
	}()
	digest, err := writeLines(f, lines, func() error { return stop.check(checkpointID) })
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return Manifest{}, err
	}
	m := Manifest{
		SchemaVersion: SchemaVersion,
		Kind:          w.Participant.Kind,
		Instance:      w.Participant.Instance,
		CheckpointID:  checkpointID,
		RecordsFile:   "records-" + digest + ".jsonl",
		RecordsSHA256: digest,
		RecordCount:   len(lines),
	}
	payload, err := marshalPythonIndent1(m.fields())
	if err != nil {
		return Manifest{}, err
	}
	manifestPath := path.Join(dir, ManifestName)
	var created bool
	err = stop.publishing(checkpointID, func() error {
		// Same name, same content: replacing a file another writer of the
		// same records renamed changes nothing.
		if err := w.FS.Rename(temporary, path.Join(dir, m.RecordsFile)); err != nil {
			return err
		}
		published = true
		var err error
		created, err = w.create(manifestPath, payload)
		return err
	})
	if err != nil {
		return Manifest{}, err
	}
	if created {
		return m, w.FS.SyncDir(dir)
	}
	existing, raw, err := loadManifest(w.FS, manifestPath)
	if err != nil {
		return Manifest{}, err
	}
	if !sameJSON(raw, payload) {
		if existing.RecordsFile != m.RecordsFile {
			_ = w.FS.Remove(path.Join(dir, m.RecordsFile))
		}
		return Manifest{}, fmt.Errorf("%w: %s already holds a different commit", ErrInvalidState, manifestPath)
	}
	return existing, nil
}

// writeLines writes each line and a newline through a buffer, hashing what
// it writes, calls check before each, and fsyncs the file. It returns the
// hex digest.
func writeLines(f File, lines [][]byte, check func() error) (string, error) {
	h := sha256.New()
	bw := bufio.NewWriterSize(io.MultiWriter(f, h), 256<<10)
	for _, line := range lines {
		if err := check(); err != nil {
			return "", err
		}
		if _, err := bw.Write(line); err != nil {
			return "", err
		}
		if err := bw.WriteByte('\n'); err != nil {
			return "", err
		}
	}
	if err := bw.Flush(); err != nil {
		return "", err
	}
	if err := f.Sync(); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// create writes payload at name unless name exists, reporting whether this
// call created it: a hard link never replaces a name, so of two racing
// writers exactly one publishes.
func (w Writer) create(name string, payload []byte) (bool, error) {
	f, err := w.FS.CreateTemp(path.Dir(name), "."+path.Base(name)+".")
	if err != nil {
		return false, err
	}
	temporary := f.Name()
	defer func() { _ = w.FS.Remove(temporary) }()
	_, err = f.Write(payload)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, err
	}
	err = w.FS.Link(temporary, name)
	if errors.Is(err, fs.ErrExist) {
		return false, nil
	}
	return err == nil, err
}

// fields is the manifest as the map Gym writes (sorted keys on output).
func (m Manifest) fields() map[string]any {
	return map[string]any{
		"schema_version": m.SchemaVersion,
		"kind":           m.Kind,
		"instance":       m.Instance,
		"checkpoint_id":  m.CheckpointID,
		"records_file":   m.RecordsFile,
		"records_sha256": m.RecordsSHA256,
		"record_count":   m.RecordCount,
	}
}

// sameJSON reports whether two JSON documents hold equal values.
func sameJSON(a, b []byte) bool {
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

// loadManifest reads a manifest: it must be a JSON object. Fields of the
// wrong type are left zero (the read's checks then refuse them).
func loadManifest(fsys FS, name string) (Manifest, []byte, error) {
	f, err := fsys.Open(name)
	if errors.Is(err, fs.ErrNotExist) {
		return Manifest{}, nil, fmt.Errorf("%w: missing manifest %s", ErrNoManifest, name)
	}
	if err != nil {
		return Manifest{}, nil, err
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return Manifest{}, nil, err
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return Manifest{}, nil, fmt.Errorf("%w: %s is not a manifest: %v", ErrInvalidState, name, err)
	}
	var m Manifest
	for key, dst := range map[string]any{
		"schema_version": &m.SchemaVersion, "kind": &m.Kind, "instance": &m.Instance,
		"checkpoint_id": &m.CheckpointID, "records_file": &m.RecordsFile,
		"records_sha256": &m.RecordsSHA256, "record_count": &m.RecordCount,
	} {
		if v, ok := obj[key]; ok {
			_ = json.Unmarshal(v, dst)
		}
	}
	return m, raw, nil
}

// ReadManifest reads the participant's manifest under checkpointDir
// without reading its records: ErrNoManifest when there is none.
func ReadManifest(fsys FS, checkpointDir string, p Participant) (Manifest, error) {
	dir, err := p.Dir(checkpointDir)
	if err != nil {
		return Manifest{}, err
	}
	m, _, err := loadManifest(fsys, path.Join(dir, ManifestName))
	return m, err
}

// Read verifies the participant's records under checkpointDir and calls
// each with every record line (without its newline), in order. The digest
// and count cover the whole file; a line that is not JSON, or an error
// from each, ends the read. The caller must not act on what each saw
// unless Read returns nil.
func Read(fsys FS, checkpointDir string, p Participant, each func(line []byte) error) (Manifest, error) {
	dir, err := p.Dir(checkpointDir)
	if err != nil {
		return Manifest{}, err
	}
	m, err := read(fsys, dir, p, each)
	if err != nil && !errors.Is(err, ErrInvalidState) {
		err = fmt.Errorf("%w: cannot read checkpoint state from %s: %w", ErrInvalidState, dir, err)
	}
	return m, err
}

func read(fsys FS, dir string, p Participant, each func(line []byte) error) (Manifest, error) {
	name := path.Join(dir, ManifestName)
	m, raw, err := loadManifest(fsys, name)
	if err != nil {
		return m, err
	}
	var typed struct {
		SchemaVersion json.RawMessage `json:"schema_version"`
		CheckpointID  any             `json:"checkpoint_id"`
		RecordsFile   any             `json:"records_file"`
		RecordCount   json.RawMessage `json:"record_count"`
	}
	_ = json.Unmarshal(raw, &typed)
	switch {
	case string(typed.SchemaVersion) != "1":
		return m, fmt.Errorf("%w: %s has unsupported schema %s", ErrInvalidState, name, typed.SchemaVersion)
	case m.Kind != p.Kind || m.Instance != p.Instance:
		return m, fmt.Errorf("%w: %s belongs to %s/%s", ErrInvalidState, name, m.Kind, m.Instance)
	}
	if _, ok := typed.CheckpointID.(string); !ok {
		return m, fmt.Errorf("%w: %s names no checkpoint", ErrInvalidState, name)
	}
	if _, ok := typed.RecordsFile.(string); !ok || !recordsFilePattern.MatchString(m.RecordsFile) {
		return m, fmt.Errorf("%w: %s names an invalid records file %v", ErrInvalidState, name, typed.RecordsFile)
	}
	recordsPath := path.Join(dir, m.RecordsFile)
	f, err := fsys.Open(recordsPath)
	if err != nil {
		return m, err
	}
	defer f.Close()
	h := sha256.New()
	count, err := readLines(f, h, func(line []byte) error {
		if !json.Valid(line) {
			return fmt.Errorf("%w: %s holds a record that is not JSON", ErrInvalidState, recordsPath)
		}
		return each(line)
	})
	if err != nil {
		return m, err
	}
	if hex.EncodeToString(h.Sum(nil)) != m.RecordsSHA256 {
		return m, fmt.Errorf("%w: %s does not match its manifest digest", ErrInvalidState, recordsPath)
	}
	if string(typed.RecordCount) != strconv.Itoa(count) {
		return m, fmt.Errorf("%w: %s expects %s records, found %d", ErrInvalidState, name, typed.RecordCount, count)
	}
	return m, nil
}

// readLines calls fn with each line of r (split after '\n', the last one
// possibly without it) stripped of its newline, hashing every byte read.
func readLines(r io.Reader, h hash.Hash, fn func(line []byte) error) (int, error) {
	br := bufio.NewReaderSize(r, 256<<10)
	count := 0
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			h.Write(line)
			count++
			body := line
			if body[len(body)-1] == '\n' {
				body = body[:len(body)-1]
			}
			if ferr := fn(body); ferr != nil {
				return count, ferr
			}
		}
		if errors.Is(err, io.EOF) {
			return count, nil
		}
		if err != nil {
			return count, err
		}
	}
}
