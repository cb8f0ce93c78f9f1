// Package uidrange hands each sandbox a host uid of its own from a block of
// ids, and refuses a block that holds an id the host already gives out. It
// only reads the host's id files it is given, so its decisions are tested
// in milliseconds apart from the sandboxes that use them.
package uidrange

import (
	"bufio"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"strconv"
	"strings"
	"sync"
)

// ErrTaken: the range holds an id the host already gives out.
var ErrTaken = errors.New("holds ids the host gives out")

// ErrExhausted: every uid of the range is held by a sandbox.
var ErrExhausted = errors.New("every uid of the range is in use")

// Range hands each sandbox a host uid of its own, from its first to its
// last.
type Range struct {
	first, last int

	mu   sync.Mutex
	used map[int]string // uid → the sandbox holding it
}

// Parse reads "FIRST-LAST": two uids above 0, FIRST not above LAST, LAST
// below 2^32-1 (the kernel's invalid id).
func Parse(s string) (*Range, error) {
	a, b, ok := strings.Cut(s, "-")
	first, err1 := strconv.Atoi(strings.TrimSpace(a))
	last, err2 := strconv.Atoi(strings.TrimSpace(b))
	if !ok || err1 != nil || err2 != nil || first <= 0 || last < first || last >= 1<<32-1 {
		return nil, fmt.Errorf("uid_range %q: want FIRST-LAST, two uids above 0, FIRST not above LAST", s)
	}
	return &Range{first: first, last: last, used: map[int]string{}}, nil
}

// Host names the files the host's ids are in. A missing file names none.
type Host struct {
	Passwd, Group  string // user and group databases: name:x:id:...
	Subuid, Subgid string // subordinate ranges: name:start:count
}

// System is this machine's: /etc/passwd, /etc/group, /etc/subuid and
// /etc/subgid.
func System() Host {
	return Host{Passwd: "/etc/passwd", Group: "/etc/group", Subuid: "/etc/subuid", Subgid: "/etc/subgid"}
}

// Bounds returns the range's first and last uid.
func (r *Range) Bounds() (first, last int) { return r.first, r.last }

func (r *Range) holds(id int) bool { return id >= r.first && id <= r.last }

// CheckHost refuses (ErrTaken) a range that holds the storage ids, an id of
// the user or group database, or overlaps a subordinate range.
func (r *Range) CheckHost(h Host, storageUID, storageGID int) error {
	for _, id := range []int{storageUID, storageGID} {
		if r.holds(id) {
			return fmt.Errorf("uid_range %d-%d %w: the sandboxes' storage id %d", r.first, r.last, ErrTaken, id)
		}
	}
	for _, f := range []string{h.Passwd, h.Group} {
		err := eachLine(f, func(fields []string) error {
			if id, err := strconv.Atoi(fields[2]); err == nil && r.holds(id) {
				return fmt.Errorf("uid_range %d-%d %w: %s names %s with id %d", r.first, r.last, ErrTaken, f, fields[0], id)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	for _, f := range []string{h.Subuid, h.Subgid} {
		err := eachLine(f, func(fields []string) error {
			start, err1 := strconv.Atoi(fields[1])
			n, err2 := strconv.Atoi(fields[2])
			if err1 == nil && err2 == nil && start <= r.last && start+n-1 >= r.first {
				return fmt.Errorf("uid_range %d-%d %w: %s gives %s %d-%d", r.first, r.last, ErrTaken, f, fields[0], start, start+n-1)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// eachLine calls f with the ':'-separated fields of each line of the file
// at path that is not blank, a comment, or short of three fields; a
// missing file (or none named) has no lines.
func eachLine(path string, f func(fields []string) error) error {
	if path == "" {
		return nil
	}
	file, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		fields := strings.Split(line, ":")
		if line == "" || strings.HasPrefix(line, "#") || len(fields) < 3 {
			continue
		}
		if err := f(fields); err != nil {
			return err
		}
	}
	return sc.Err()
}

// Take gives sandbox id a free uid of the range: the one its id hashes to
// first, so that ids spread over the range, else the next free one after
// it (round the end).
func (r *Range) Take(id string) (int, error) {
	n := r.last - r.first + 1
	h := fnv.New64a()
	h.Write([]byte(id))
	start := int(h.Sum64() % uint64(n))
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := 0; i < n; i++ {
		uid := r.first + (start+i)%n
		if _, held := r.used[uid]; !held {
			r.used[uid] = id
			return uid, nil
		}
	}
	return 0, fmt.Errorf("local: uid_range %d-%d: %w", r.first, r.last, ErrExhausted)
}

// Hold marks uid as held by sandbox id (one found on disk).
func (r *Range) Hold(uid int, id string) {
	r.mu.Lock()
	r.used[uid] = id
	r.mu.Unlock()
}

// Release frees the uid sandbox id held; a uid another sandbox holds now
// stays held.
func (r *Range) Release(uid int, id string) {
	r.mu.Lock()
	if r.used[uid] == id {
		delete(r.used, uid)
	}
	r.mu.Unlock()
}
