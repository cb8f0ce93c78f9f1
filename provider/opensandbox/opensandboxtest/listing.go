package opensandboxtest

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// paging reads page and pageSize (1-200, default 20).
func (s *Server) paging(w http.ResponseWriter, r *http.Request) (page, size int, ok bool) {
	page, size = 1, 20
	q := r.URL.Query()
	for _, f := range []struct {
		name string
		dst  *int
		max  int
	}{{"page", &page, 1 << 30}, {"pageSize", &size, 200}} {
		v := q.Get(f.name)
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > f.max {
			s.note(r, fmt.Sprintf("%s=%q is out of range", f.name, v))
			writeInvalid(w, fmt.Sprintf("%s must be 1-%d", f.name, f.max))
			return 0, 0, false
		}
		*f.dst = n
	}
	return page, size, true
}

// writePage answers page (from 1) of items, size a page, with the real
// server's pagination object; a page past the end has no items ([], never
// null).
func writePage(w http.ResponseWriter, items []map[string]any, page, size int) {
	total := len(items)
	from := min((page-1)*size, total)
	to := min(from+size, total)
	pages := (total + size - 1) / size
	writeJSON(w, http.StatusOK, map[string]any{
		"items": append([]map[string]any{}, items[from:to]...),
		"pagination": map[string]any{
			"page": page, "pageSize": size, "totalItems": total, "totalPages": pages, "hasNextPage": page < pages,
		},
	})
}

// states returns the state filter, or nil for none. Matching is
// case-insensitive.
func states(q url.Values) []string { return q["state"] }

func matchLabels(md map[string]string, want url.Values) bool {
	for k := range want {
		if v, ok := md[k]; !ok || v != want.Get(k) {
			return false
		}
	}
	return true
}

func matchState(filter []string, st string) bool {
	if len(filter) == 0 {
		return true
	}
	for _, f := range filter {
		if strings.EqualFold(f, st) {
			return true
		}
	}
	return false
}

// newestFirst orders ids as the real server lists: the newest first.
func newestFirst(ids []string) []string {
	slices.Reverse(ids)
	return ids
}
