package owner

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxowner/owner/internal/script"
	"github.com/sandboxowner/owner/provider"
)

// TestPoolScripts runs testdata/pool/*.txt against the warm pools' book:
// "pools size= refill= idle=" (idle in seconds) makes it, then "claim
// key=", "started key= gen= id= at=" (fail: the start failed), "expire
// at=", "drain key=", "drain-all", "counts" and "state".
func TestPoolScripts(t *testing.T) {
	script.Run(t, "testdata/pool/*.txt", func(t *testing.T) func(c *script.Case) string {
		var b *poolBook
		num := func(c *script.Case, key string) int {
			n, err := strconv.Atoi(c.Args[key])
			if err != nil {
				t.Fatalf("%s: %s=%q is no number", c.Pos, key, c.Args[key])
			}
			return n
		}
		secs := func(c *script.Case) time.Time { return scriptT0.Add(time.Duration(num(c, "at")) * time.Second) }
		return func(c *script.Case) string {
			switch c.Cmd {
			case "pools":
				b = newPoolBook(num(c, "size"), num(c, "refill"), time.Duration(num(c, "idle"))*time.Second)
				return "ok"
			case "claim":
				p, hit, starts := b.claim(c.Args["key"])
				if !hit {
					return "miss; start " + startsText(starts)
				}
				return fmt.Sprintf("hit %s; start %s", p.Handle.SandboxID, startsText(starts))
			case "started":
				s := poolStart{Key: c.Args["key"], Gen: uint64(num(c, "gen"))}
				stop, starts := b.started(s, pooled{Handle: provider.Handle{SandboxID: c.Args["id"]}, At: secs(c)}, !c.Has("fail"))
				return fmt.Sprintf("stop=%t; start %s", stop, startsText(starts))
			case "expire":
				return "stop " + pooledText(b.expire(secs(c)))
			case "drain":
				return "stop " + pooledText(b.drain(c.Args["key"]))
			case "drain-all":
				return "stop " + pooledText(b.drainAll())
			case "counts":
				r, s := b.counts()
				return fmt.Sprintf("ready=%d starting=%d sandboxes=%d", r, s, len(b.sandboxes()))
			case "state":
				return b.String()
			}
			t.Fatalf("%s: unknown command %q", c.Pos, c.Cmd)
			return ""
		}
	})
}

func startsText(ss []poolStart) string {
	var out []string
	for _, s := range ss {
		out = append(out, fmt.Sprintf("%s/%d", s.Key, s.Gen))
	}
	return "[" + strings.Join(out, ",") + "]"
}

func pooledText(ps []pooled) string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Handle.SandboxID)
	}
	return "[" + strings.Join(out, ",") + "]"
}
