package local

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

// DefaultUIDRange is the block of host uids (and gids, the same numbers)
// sandboxes get one each of: above the ranges distributions give users,
// system services and containers' subordinate ids (systemd leaves
// 0x70000000 and up unassigned), and checked at startup against the host's
// users, groups and /etc/subuid and /etc/subgid.
const DefaultUIDRange = "1879048192-1879113727"

// UIDRangeNone makes every sandbox run as Options.UID and GID.
const UIDRangeNone = "none"

// uidRange hands each sandbox a host uid of its own, from first to last.
type uidRange struct {
	first, last int
	mu          sync.Mutex
	used        map[int]string // uid → the sandbox holding it
}

// parseUIDRange reads "FIRST-LAST".
func parseUIDRange(s string) (*uidRange, error) {
	a, b, ok := strings.Cut(s, "-")
	first, err1 := strconv.Atoi(strings.TrimSpace(a))
	last, err2 := strconv.Atoi(strings.TrimSpace(b))
	if !ok || err1 != nil || err2 != nil || first <= 0 || last < first || last >= 1<<32-1 {
		return nil, fmt.Errorf("uid_range %q: want FIRST-LAST, two uids above 0, FIRST not above LAST", s)
	}
	return &uidRange{first: first, last: last, used: map[int]string{}}, nil
}

// errUIDRangeTaken: the range holds an id the host already gives out.
var errUIDRangeTaken = errors.New("holds ids the host gives out")

// checkHostIDs refuses a range that holds an id of /etc/passwd or
// /etc/group, overlaps a range of /etc/subuid or /etc/subgid, or holds
// the storage ids.
func (r *uidRange) checkHostIDs(storageUID, storageGID int) error {
	for _, id := range []int{storageUID, storageGID} {
		if id >= r.first && id <= r.last {
			return fmt.Errorf("uid_range %d-%d %w: the sandboxes' storage id %d", r.first, r.last, errUIDRangeTaken, id)
		}
	}
	for _, f := range []string{"/etc/passwd", "/etc/group"} {
		err := eachLine(f, func(line string) error {
			fields := strings.Split(line, ":")
			if len(fields) < 3 {
				return nil
			}
			if id, err := strconv.Atoi(fields[2]); err == nil && id >= r.first && id <= r.last {
				return fmt.Errorf("uid_range %d-%d %w: %s names %s with id %d", r.first, r.last, errUIDRangeTaken, f, fields[0], id)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	for _, f := range []string{"/etc/subuid", "/etc/subgid"} {
		err := eachLine(f, func(line string) error {
			fields := strings.Split(line, ":")
			if len(fields) < 3 {
				return nil
			}
			start, err1 := strconv.Atoi(fields[1])
			n, err2 := strconv.Atoi(fields[2])
			if err1 == nil && err2 == nil && start <= r.last && start+n-1 >= r.first {
				return fmt.Errorf("uid_range %d-%d %w: %s gives %s %d-%d", r.first, r.last, errUIDRangeTaken, f, fields[0], start, start+n-1)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// eachLine calls f on each line of the file at path that is not a
// comment; a missing file has none.
func eachLine(path string, f func(string) error) error {
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
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if err := f(line); err != nil {
			return err
		}
	}
	return sc.Err()
}

// errNoUID: every uid of the range is held by a sandbox.
var errNoUID = errors.New("every uid of the range is in use")

// take gives sandbox id a free uid of the range (one that hashes from the
// id first, so that ids spread over the range).
func (r *uidRange) take(id string) (int, error) {
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
	return 0, fmt.Errorf("local: uid_range %d-%d: %w", r.first, r.last, errNoUID)
}

// hold marks uid as held by sandbox id (one found on disk).
func (r *uidRange) hold(uid int, id string) {
	r.mu.Lock()
	r.used[uid] = id
	r.mu.Unlock()
}

// release frees the uid sandbox id held.
func (r *uidRange) release(uid int, id string) {
	r.mu.Lock()
	if r.used[uid] == id {
		delete(r.used, uid)
	}
	r.mu.Unlock()
}
