package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxowner/owner/internal/script"
	"github.com/sandboxowner/owner/problem"
)

// TestStepScripts runs the scripted tests of the control plane's Step
// machine: testdata/step/*.txt. Times are seconds after the script's start
// (deadline=60 is deadline_ts a minute after the current time).
func TestStepScripts(t *testing.T) {
	script.Run(t, "testdata/step/*.txt", func(t *testing.T) func(c *script.Case) string {
		t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
		r := &stepRun{t: t, t0: t0, now: t0, s: newState("resources", "notes", 600*time.Second, time.Hour)}
		return r.do
	})
}

type stepRun struct {
	t   *testing.T
	t0  time.Time
	now time.Time
	s   *state
}

func (r *stepRun) base(c *script.Case) Base {
	d := 60.0
	if v, ok := c.Args["deadline"]; ok {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			r.t.Fatalf("%s: deadline %q: %v", c.Pos, v, err)
		}
		d = f
	}
	return Base{CheckpointID: c.Args["id"], DeadlineTS: UnixSeconds(r.now.Add(time.Duration(d * float64(time.Second))))}
}

func (r *stepRun) episodes(c *script.Case, key string) []EpisodeID {
	keys := c.List(key)
	if keys == nil {
		return nil
	}
	out := []EpisodeID{}
	for _, k := range keys {
		e, err := ParseCaptureKey(k)
		if err != nil {
			r.t.Fatalf("%s: %v", c.Pos, err)
		}
		out = append(out, e)
	}
	return out
}

func report(c *script.Case) Report {
	return Report{Ready: c.Args["ready"] != "false", Blockers: c.List("blockers"), Restarts: c.List("restarts")}
}

func errArg(c *script.Case) error {
	if v, ok := c.Args["err"]; ok {
		return errors.New(v)
	}
	return nil
}

func (r *stepRun) commitReq(c *script.Case) CommitRequest {
	return CommitRequest{Base: r.base(c), CheckpointDir: c.Args["dir"], EpisodeIDs: r.episodes(c, "episodes")}
}

func (r *stepRun) restoreReq(c *script.Case) RestoreRequest {
	return RestoreRequest{Base: r.base(c), CheckpointDir: c.Args["dir"], SourceCheckpointID: c.Args["src"], EpisodeIDs: r.episodes(c, "episodes")}
}

func (r *stepRun) do(c *script.Case) string {
	var in input
	switch c.Cmd {
	case "advance":
		d, err := time.ParseDuration(c.Words[0])
		if err != nil {
			r.t.Fatalf("%s: %v", c.Pos, err)
		}
		r.now = r.now.Add(d)
		return fmt.Sprintf("now +%s", r.now.Sub(r.t0))
	case "state":
		return r.state()
	case "fenced":
		e, err := ParseCaptureKey(c.Words[0])
		if err != nil {
			r.t.Fatalf("%s: %v", c.Pos, err)
		}
		return strconv.FormatBool(r.s.Fenced(e))
	case "tick":
		in = inTick{}
	case "status":
		in = inStatus{Report: report(c), Description: Description{Mode: "exported", Verify: "wait"}}
	case "prepare":
		in = inPrepare{Req: PrepareRequest{Base: r.base(c)}}
	case "readiness":
		in = inReadiness{Req: PrepareRequest{Base: r.base(c)}, Report: report(c)}
	case "commit":
		in = inCommit{Req: r.commitReq(c)}
	case "commit-check":
		in = inCommitCheck{Req: r.commitReq(c), Report: report(c)}
	case "commit-done":
		res := CommitResult{Manifest: Manifest{CheckpointID: c.Args["id"], RecordCount: len(c.List("exported")), RecordsSHA256: "sha"}, EpisodeIDs: c.List("exported"), Parked: c.List("parked")}
		in = inCommitDone{Req: r.commitReq(c), Result: res, Err: errArg(c)}
	case "restore":
		in = inRestore{Req: r.restoreReq(c)}
	case "restore-done":
		in = inRestoreDone{Req: r.restoreReq(c), Result: RestoreResult{SourceCheckpointID: c.Args["src"], Restored: c.List("restored")}, Err: errArg(c)}
	case "resume":
		in = inResume{Req: ResumeRequest{Base: r.base(c)}, WriterStopped: c.Has("stopped")}
	case "retire":
		in = inRetire{Req: RetireRequest{Base: r.base(c), EpisodeIDs: r.episodes(c, "episodes")}}
	case "retire-done":
		in = inRetireDone{Req: RetireRequest{Base: r.base(c), EpisodeIDs: r.episodes(c, "episodes")}, Err: errArg(c)}
	case "forget":
		in = inForget{Req: ForgetRequest{Base: r.base(c), RolloutIDs: c.List("rollouts")}}
	case "renew":
		in = inRenew{Req: RenewRequest{Base: r.base(c)}}
	case "admission-failed":
		in = inAdmissionFailed{Op: c.Args["op"], ID: c.Args["id"], Err: errArg(c)}
	default:
		r.t.Fatalf("%s: unknown command %q", c.Pos, c.Cmd)
	}
	out := r.s.Step(in, r.now)
	return r.render(out) + "\n" + r.state()
}

func (r *stepRun) at(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return "+" + t.Sub(r.t0).String()
}

func (r *stepRun) render(out output) string {
	var b strings.Builder
	if out.Err != nil {
		var e *problem.Error
		if errors.As(out.Err, &e) {
			fmt.Fprintf(&b, "error: %s: %s\n", e.Code, e.Detail)
		} else {
			fmt.Fprintf(&b, "error: %v\n", out.Err)
		}
	}
	if out.Reply != nil {
		j, err := json.Marshal(out.Reply)
		if err != nil {
			r.t.Fatal(err)
		}
		fmt.Fprintf(&b, "reply: %s\n", j)
	}
	if out.Await != nil {
		fmt.Fprintf(&b, "await: %s %s\n", out.Await.Op, out.Await.ID)
	}
	if out.Start {
		b.WriteString("start\n")
	}
	if out.Wait {
		b.WriteString("wait\n")
	}
	if out.StopWriter {
		b.WriteString("stop writer\n")
	}
	for _, e := range out.Effects {
		switch e := e.(type) {
		case effCloseAdmission:
			fmt.Fprintf(&b, "effect: close admission (%s %s)\n", e.Op, e.ID)
		case effOpenAdmission:
			b.WriteString("effect: open admission\n")
		case effRun:
			fmt.Fprintf(&b, "effect: run %s %s\n", e.Key.Op, e.Key.ID)
		case effRetire:
			fmt.Fprintf(&b, "effect: retire %s by %s\n", strings.Join(CaptureKeys(e.Episodes), ","), r.at(e.Deadline))
		case effForget:
			fmt.Fprintf(&b, "effect: forget %s\n", strings.Join(e.RolloutIDs, ","))
		case effStopWriter:
			fmt.Fprintf(&b, "effect: stop writer %s\n", e.ID)
		case effSettle:
			fmt.Fprintf(&b, "effect: settle %s %s\n", e.Key.Op, e.Key.ID)
		case effNotify:
			b.WriteString("effect: notify\n")
		case effLog:
			fmt.Fprintf(&b, "effect: log %s %q\n", e.Level, e.Msg)
		default:
			fmt.Fprintf(&b, "effect: %T\n", e)
		}
	}
	return strings.TrimRight(b.String(), "\n")
}

// state renders the whole state on one line, maps sorted.
func (r *stepRun) state() string {
	s := r.s
	var results, running, fence []string
	for k := range s.results {
		results = append(results, k.Op+" "+k.ID)
	}
	for k := range s.running {
		running = append(running, k.Op+" "+k.ID)
	}
	for id, a := range s.fence {
		fence = append(fence, fmt.Sprintf("%s<=%d", id, a))
	}
	sort.Strings(results)
	sort.Strings(running)
	sort.Strings(fence)
	active := s.Active
	if active == "" {
		active = "-"
	}
	return fmt.Sprintf("state: %s active=%s lease=%s results=[%s] running=[%s] resumed=[%s] fence=[%s] retiring=%d",
		s.Phase, active, r.at(s.Lease), strings.Join(results, ", "), strings.Join(running, ", "),
		strings.Join(s.resumed.Keys(), ","), strings.Join(fence, ","), s.Retiring)
}
