package swebench

import (
	"strconv"
	"testing"
)

// BenchmarkWarmGinGrading times the verify of the real gin instance on a
// warm template (its environment step and validation run before the
// timer, by a first seed), one at a time: with no change by the agent, and
// with the gold patch. Each op is one verify (the patch taken from the
// agent's sandbox, its session ended, the grading); the seed and the
// agent's edit are outside the timer. It also reports the grading's own
// figures (patch_verification_time_taken and its sandbox start and eval).
// Issue 24's goal is a warm gin grading in at most 5 s:
//
//	go test -run '^$' -bench WarmGinGrading -benchtime 3x ./resources/swebench/
func BenchmarkWarmGinGrading(b *testing.B) {
	ri := ginInstance
	proxy := cachingProxy(b, realProxy(b, ri))
	row := ri.row(b, proxy)
	w := newWorld(b, task{}, withConfig(ri.config(proxy)))
	w.seed("s-warm", row)
	cases := []struct{ name, agent string }{
		{"no change", "true"},
		{"gold", "git apply - <<'EOF'\n" + row["patch"].(string) + "EOF\n"},
	}
	seeds := 0 // session ids are never reused (b.N's first probe runs too)
	for _, c := range cases {
		want := 0.0
		if c.name == "gold" {
			want = 1
		}
		b.Run(c.name, func(b *testing.B) {
			w := w.in(b)
			var grading, start, eval float64
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				seeds++
				sid := "s-" + strconv.Itoa(seeds)
				seed := w.seed(sid, row)
				w.agentRun(*seed.SandboxHandle, c.agent)
				b.StartTimer()
				res := w.verify(sid, row)
				b.StopTimer()
				if res.Reward != want || res.MaskSample {
					b.Fatalf("want reward %v, got:\n%s", want, describe(res))
				}
				grading += res.PatchVerificationTimeTaken
				start += res.EvalSandboxStartTimeTaken
				eval += res.EvalTimeTaken
			}
			n := float64(b.N)
			b.ReportMetric(grading/n, "grading-s/op")
			b.ReportMetric(start/n, "start-s/op")
			b.ReportMetric(eval/n, "eval-s/op")
		})
	}
}
