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
// key=", "started key= gen= id= at= [ttl=]" (fail: the start failed; ttl:
// its lease in seconds), "tick at=", "renewed id= at=" (fail: the renewal
// failed), "drain key=", "drain-all", "counts" and "state".
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
				var ttl time.Duration
				if c.Has("ttl") {
					ttl = time.Duration(num(c, "ttl")) * time.Second
				}
				stop, starts := b.started(s, pooled{Handle: provider.Handle{SandboxID: c.Args["id"]}, At: secs(c), TTL: ttl, Leased: secs(c)}, !c.Has("fail"))
				return fmt.Sprintf("stop=%t; start %s", stop, startsText(starts))
			case "tick":
				stop, renew := b.tick(secs(c))
				return fmt.Sprintf("stop %s; renew %s", pooledText(stop), pooledText(renew))
			case "renewed":
				p, taken := b.renewed(c.Args["id"], secs(c), !c.Has("fail"))
				if !taken {
					return "kept"
				}
				return "stop " + p.Handle.SandboxID
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

// TestPoolConfig: no provider, no pools; a lease leaves the idle time as
// configured (pooled leases are renewed).
func TestPoolConfig(t *testing.T) {
	fk := fakeProvider{}
	for _, tc := range []struct {
		name string
		c    Config
		want PoolConfig
	}{
		{"no provider", Config{Pool: PoolConfig{Size: 2, MaxIdle: time.Hour}}, PoolConfig{Size: 0, MaxIdle: time.Hour}},
		{"no lease", Config{Provider: fk, Pool: PoolConfig{Size: 2, MaxIdle: time.Hour}}, PoolConfig{Size: 2, MaxIdle: time.Hour}},
		{"lease", Config{Provider: fk, DefaultTTL: time.Hour, Pool: PoolConfig{Size: 2, MaxIdle: 2 * time.Hour}}, PoolConfig{Size: 2, MaxIdle: 2 * time.Hour}},
	} {
		if got := poolConfig(tc.c); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// fakeProvider is a provider that is only there.
type fakeProvider struct{ provider.Provider }
