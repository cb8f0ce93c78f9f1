package owner

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sandboxowner/owner/internal/script"
)

// TestTemplateScripts runs testdata/template/*.txt against the template
// book: "seed key= at=" (at in seconds), "built key= flight= snapshot= at=",
// "failed key= flight= err=", "wake flight=", "leave flight=", "lost key=
// snapshot=", "load key= snapshot= at=", "expire before=", "take-all" and
// "state".
func TestTemplateScripts(t *testing.T) {
	script.Run(t, "testdata/template/*.txt", func(t *testing.T) func(c *script.Case) string {
		b := newTemplateBook()
		secs := func(c *script.Case, key string) time.Time {
			n, err := strconv.Atoi(c.Args[key])
			if err != nil && c.Has(key) {
				t.Fatalf("%s: %s=%q is no number", c.Pos, key, c.Args[key])
			}
			return scriptT0.Add(time.Duration(n) * time.Second)
		}
		flight := func(c *script.Case) uint64 {
			n, err := strconv.ParseUint(c.Args["flight"], 10, 64)
			if err != nil {
				t.Fatalf("%s: flight=%q is no number", c.Pos, c.Args["flight"])
			}
			return n
		}
		return func(c *script.Case) string {
			key := c.Args["key"]
			switch c.Cmd {
			case "seed":
				return b.seed(key, secs(c, "at")).String()
			case "built":
				n := b.built(key, flight(c), tmplReady{SnapshotID: c.Args["snapshot"], Workdir: "/w"}, secs(c, "at"))
				return fmt.Sprintf("%d to wake", n)
			case "failed":
				n := b.failed(key, flight(c), errors.New(c.Args["err"]))
				return fmt.Sprintf("%d to wake", n)
			case "wake":
				return b.wake(flight(c)).String()
			case "leave":
				b.leave(flight(c))
				return "ok"
			case "lost":
				return fmt.Sprintf("forgot=%t", b.lost(key, c.Args["snapshot"]))
			case "load":
				b.load(key, tmplReady{SnapshotID: c.Args["snapshot"]}, secs(c, "at"))
				return "ok"
			case "expire":
				return readyText(b.expire(secs(c, "before")))
			case "take-all":
				return readyText(b.takeAll())
			case "snapshots":
				return fmt.Sprint(b.snapshots())
			case "state":
				return b.String()
			}
			t.Fatalf("%s: unknown command %q", c.Pos, c.Cmd)
			return ""
		}
	})
}

func readyText(m map[string]tmplReady) string {
	s := ""
	for _, k := range slices.Sorted(maps.Keys(m)) {
		s += fmt.Sprintf("%s snapshot=%s\n", k, m[k].SnapshotID)
	}
	if s == "" {
		return "none"
	}
	return s
}
