package harness

// Go benchmarks of the owner's hot paths:
//
//	go test ./bench/harness -run '^$' -bench . -benchmem
//
// The index commit of N records is bench/snapshotindex_test.go's
// BenchmarkCommit1000 (go test ./bench -run '^$' -bench Commit1000), and the
// whole commit through the owner is owner/bench_test.go's.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"
	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/clock"
	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/sandboxapi"
)

func benchOwner(b *testing.B, sessions int) *owner.Owner {
	b.Helper()
	env, err := newOwnerEnv(context.Background(), b.TempDir(), 64)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(env.remove)
	if err := SeedSessions(context.Background(), env.o, "s", sessions); err != nil {
		b.Fatal(err)
	}
	return env.o
}

// cpuMeter reports the process's CPU time (user and system, every
// goroutine's) per iteration as "cpu-ns/op": on a shared machine it moves
// far less than ns/op, which is wall time, with the other work there.
type cpuMeter struct {
	b     *testing.B
	start time.Duration
	ok    bool
}

func startCPU(b *testing.B) cpuMeter {
	t, ok := selfCPU()
	return cpuMeter{b: b, start: t, ok: ok}
}

func (m cpuMeter) report() {
	if t, ok := selfCPU(); ok && m.ok && m.b.N > 0 {
		m.b.ReportMetric(float64(t-m.start)/float64(m.b.N), "cpu-ns/op")
	}
}

func noop(context.Context, provider.Provider, sandbox.Sandbox) error { return nil }

// BenchmarkSessionDo is one request round trip through a session actor:
// the supervisor lookup, the ask, fn on its own goroutine, the reply.
func BenchmarkSessionDo(b *testing.B) {
	o := benchOwner(b, 1)
	ctx := context.Background()
	b.ReportAllocs()
	cpu := startCPU(b)
	for b.Loop() {
		if err := o.Do(ctx, "s-000000", noop); err != nil {
			b.Fatal(err)
		}
	}
	cpu.report()
}

// BenchmarkSessionDoParallel is BenchmarkSessionDo from many callers on
// 1,024 sessions, as the HTTP server drives it.
func BenchmarkSessionDoParallel(b *testing.B) {
	const n = 1024
	o := benchOwner(b, n)
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(32)
	next := make(chan int, 1<<16)
	for i := range cap(next) {
		next <- i % n
	}
	// Seeding the sessions is not the figure (it took the whole benchtime,
	// so that one iteration ran).
	b.ResetTimer()
	cpu := startCPU(b)
	b.RunParallel(func(pb *testing.PB) {
		sid := fmt.Sprintf("s-%06d", <-next)
		for pb.Next() {
			if err := o.Do(ctx, sid, noop); err != nil {
				b.Error(err)
				return
			}
		}
	})
	cpu.report()
}

// BenchmarkSessionSandbox is a read of a session's sandbox (what
// /sandbox_access asks): the lookup and a load of the view its actor
// published.
func BenchmarkSessionSandbox(b *testing.B) {
	o := benchOwner(b, 1)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := o.SessionSandbox(context.Background(), "s-000000"); !ok {
			b.Fatal("no sandbox")
		}
	}
}

// BenchmarkCoordinatorRound is the coordinator's fan-out and fan-in alone:
// one snapshot round over N installed session actors on the fake at zero
// latency, without the owner's index transactions. ns/op over N is the
// per-session cost.
func BenchmarkCoordinatorRound(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			benchRound(b, n)
		})
	}
}

func benchRound(b *testing.B, n int) {
	ctx := context.Background()
	fk := fake.New(fake.Options{Seed: 1})
	lg := logrus.New()
	lg.SetLevel(logrus.PanicLevel)
	sys := actor.NewActorSystem()
	b.Cleanup(sys.Shutdown)
	env := &actors.SessionEnv{Provider: fk, Clock: clock.Real{}, Log: lg, Limiter: actors.NewLimiter(64)}
	refs := make([]messages.SessionRef, n)
	names := make(map[string]string, n)
	for i := range refs {
		sid := fmt.Sprintf("s-%06d", i)
		h, err := fk.Start(ctx, provider.Spec{Image: "notes", Workdir: fake.DefaultWorkdir})
		if err != nil {
			b.Fatal(err)
		}
		sb := sandbox.Sandbox{Handle: h, Spec: provider.Spec{Image: "notes"}, Workdir: fake.DefaultWorkdir}
		pid := sys.Root.Spawn(actors.SessionProps(env, func() *actors.Session { return actors.NewInstalledSession(sid, sb) }))
		refs[i] = messages.SessionRef{SessionID: sid, PID: pid}
		names[sid] = "snap-" + sid
	}
	coord := sys.Root.Spawn(actors.CoordinatorProps(&actors.CoordinatorEnv{Log: lg}))
	b.ReportAllocs()
	round := uint64(0)
	for b.Loop() {
		round++
		v, err := sys.Root.RequestFuture(coord, &actors.StartRound{ID: round, Sessions: refs, Names: names, Deadline: time.Now().Add(time.Minute)}, time.Minute).Result()
		if err != nil {
			b.Fatal(err)
		}
		if rr := v.(*actors.RoundResult); len(rr.Taken) != n || len(rr.Failed) > 0 {
			b.Fatalf("round took %d of %d, failed %v", len(rr.Taken), n, rr.Failed)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n)/1e3, "µs/session")
}

// BenchmarkAccessToken mints and verifies a sandbox access token
// (sandboxapi, the /sandbox_access descriptor's token).
func BenchmarkAccessToken(b *testing.B) {
	tk, err := sandboxapi.NewTokens([]byte("0123456789abcdef0123456789abcdef"), nil)
	if err != nil {
		b.Fatal(err)
	}
	exp := time.Now().Add(time.Hour)
	b.Run("mint", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = tk.Mint("fake-sb-123456", exp)
		}
	})
	tok := tk.Mint("fake-sb-123456", exp)
	b.Run("verify", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := tk.Verify(tok, "fake-sb-123456"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkSessionCookie signs and checks a session cookie (package http's
// Signer), as every request does.
func BenchmarkSessionCookie(b *testing.B) {
	s, err := httpapi.NewSigner("notes___notes", []byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		b.Fatal(err)
	}
	id := httpapi.NewID()
	b.Run("sign", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = s.Sign(id)
		}
	})
	v := s.Sign(id)
	b.Run("verify", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := s.Verify(v); !ok {
				b.Fatal("a genuine cookie did not verify")
			}
		}
	})
}

// handlerCall starts a notes server on the fake (shut down when b ends)
// and returns a function that calls its handler with a POST of body to
// path carrying cookie, fails b unless it answers 200, and returns the
// cookie its reply sets, if any.
func handlerCall(b *testing.B) func(rc *fasthttp.RequestCtx, path, body, cookie string) string {
	srv, o, err := newServer(context.Background(), b.TempDir(), fake.New(fake.Options{Seed: 1}))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = srv.Shutdown(context.Background())
		_ = o.Close()
	})
	h := srv.Handler()
	return func(rc *fasthttp.RequestCtx, path, body, cookie string) (setCookie string) {
		rc.Request.Reset()
		rc.Response.Reset()
		rc.Request.Header.SetMethod(fasthttp.MethodPost)
		rc.Request.SetRequestURI(path)
		rc.Request.SetBodyString(body)
		if cookie != "" {
			rc.Request.Header.Set("Cookie", cookie)
		}
		h(rc)
		if rc.Response.StatusCode() != fasthttp.StatusOK {
			b.Fatalf("%s: %d %s", path, rc.Response.StatusCode(), rc.Response.Body())
		}
		for name, raw := range rc.Response.Header.Cookies() {
			ck := fasthttp.AcquireCookie()
			if ck.ParseBytes(raw) == nil {
				setCookie = string(name) + "=" + string(ck.Value())
			}
			fasthttp.ReleaseCookie(ck)
		}
		return setCookie
	}
}

// BenchmarkHandlerOneCaller is BenchmarkHandler's seed+close from one
// caller, one pair after another: where the mailboxes run on the caller's
// goroutine, nothing else runs them.
func BenchmarkHandlerOneCaller(b *testing.B) {
	call := handlerCall(b)
	rc := &fasthttp.RequestCtx{}
	rc.Init(&fasthttp.Request{}, nil, nil)
	b.ReportAllocs()
	cpu := startCPU(b)
	defer cpu.report()
	for b.Loop() {
		cookie := call(rc, stepSeed.path(), stepSeed.body(), "")
		call(rc, stepClose.path(), stepClose.body(), cookie)
	}
}

// BenchmarkHandler is one request through package http's handler, called
// directly (no sockets): what the owner's server spends per request beyond
// fasthttp's own reading and writing. Each parallel caller has its own
// session, as each agent does.
func BenchmarkHandler(b *testing.B) {
	call := handlerCall(b)
	for _, sc := range []struct {
		name  string
		steps []step
		setup bool
	}{
		{"sandbox_access", []step{stepAccess}, true},
		{"append_note", []step{stepAppend}, true},
		{"seed+close", []step{stepSeed, stepClose}, false},
	} {
		b.Run(sc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(16) // enough callers to keep both CPUs busy
			cpu := startCPU(b)
			defer cpu.report()
			b.RunParallel(func(pb *testing.PB) {
				rc := &fasthttp.RequestCtx{}
				rc.Init(&fasthttp.Request{}, nil, nil)
				cookie := ""
				if sc.setup {
					cookie = call(rc, stepSeed.path(), stepSeed.body(), "")
				}
				for pb.Next() {
					c := cookie
					for _, s := range sc.steps {
						if set := call(rc, s.path(), s.body(), c); set != "" {
							c = set
						}
					}
				}
			})
		})
	}
}
