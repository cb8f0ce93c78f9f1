package actors

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxowner/owner/internal/script"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
)

var scriptT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func secs(t *testing.T, c *script.Case, key string) time.Time {
	v, err := strconv.Atoi(c.Args[key])
	if err != nil {
		t.Fatalf("%s: %s=%q: %v", c.Pos, key, c.Args[key], err)
	}
	return scriptT0.Add(time.Duration(v) * time.Second)
}

func seq(t *testing.T, c *script.Case) uint64 {
	v, err := strconv.ParseUint(c.Args["seq"], 10, 64)
	if err != nil {
		t.Fatalf("%s: seq=%q: %v", c.Pos, c.Args["seq"], err)
	}
	return v
}

func scriptErr(c *script.Case) error {
	if v, ok := c.Args["err"]; ok {
		return errors.New(v)
	}
	return nil
}

func split(c *script.Case, key string) []string {
	if v := c.Args[key]; v != "" {
		return strings.Split(v, ",")
	}
	return nil
}

// TestSessionScripts runs testdata/session/*.txt against Session.Step.
// Each script begins with "new" or "installed"; times are seconds after
// the script's start.
func TestSessionScripts(t *testing.T) {
	script.Run(t, "testdata/session/*.txt", func(t *testing.T) func(c *script.Case) string {
		var s *Session
		return func(c *script.Case) string {
			var in any
			switch c.Cmd {
			case "new":
				s = NewSession(c.Args["id"])
				return sessionState(s)
			case "installed":
				sb := sandboxOf(c.Args["sandbox"])
				sb.Restored = c.Has("restored")
				if c.Has("nodata") {
					sb.Data = nil
				}
				if c.Has("ttl") {
					sb.Spec.TTLSeconds, _ = strconv.ParseFloat(c.Args["ttl"], 64)
					sb.ExpiresAt = secs(t, c, "expires")
				}
				s = NewInstalledSession(c.Args["id"], sb)
				return sessionState(s)
			case "start":
				in = &messages.StartSandbox{}
			case "stop":
				stop := &messages.StopSandbox{Reason: messages.StopReason(c.Args["reason"])}
				if c.Has("idle-since") {
					stop.IdleSince = secs(t, c, "idle-since")
				}
				in = stop
			case "touch":
				in = &messages.Touch{At: secs(t, c, "at")}
			case "lends":
				s.lends = true
				return sessionState(s)
			case "recalled":
				in = recalled{}
			case "returned":
				ret := &messages.DoReturned{Lost: c.Has("lost"), Err: scriptErr(c)}
				if c.Has("not-found") {
					ret.Err = fmt.Errorf("read notes.txt: %w", provider.ErrSandboxNotFound)
				}
				in = ret
			case "do":
				in = &messages.Do{}
			case "take-snapshot":
				r, _ := strconv.ParseUint(c.Args["round"], 10, 64)
				in = &messages.TakeSnapshot{Round: r}
			case "view":
				in = &messages.GetSandbox{}
			case "forgotten":
				in = &messages.SessionForgotten{}
			case "renew":
				in = &messages.RenewLease{Now: secs(t, c, "at")}
			case "start-done":
				d := startDone{Seq: seq(t, c), Err: scriptErr(c)}
				if c.Has("sandbox") {
					d.Sandbox = sandboxOf(c.Args["sandbox"])
				}
				in = d
			case "stop-done":
				in = stopDone{Seq: seq(t, c), Err: scriptErr(c)}
			case "do-done":
				in = doDone{Seq: seq(t, c), Err: scriptErr(c)}
			case "snapshot-done":
				in = snapshotDone{Seq: seq(t, c), SnapshotID: c.Args["snapshot"], Err: scriptErr(c)}
			case "renew-done":
				d := renewDone{Seq: seq(t, c), Err: scriptErr(c)}
				if c.Has("until") {
					d.Until = secs(t, c, "until")
				}
				in = d
			default:
				t.Fatalf("%s: unknown command %q", c.Pos, c.Cmd)
			}
			effects := kinds(s.Step(in, "caller"))
			out := "effects: -"
			if len(effects) > 0 {
				out = "effects: " + strings.Join(effects, " ")
			}
			return out + "\n" + sessionState(s)
		}
	})
}

func sessionState(s *Session) string {
	sb := s.Sandbox.Handle.SandboxID
	if sb == "" {
		sb = "-"
	}
	exp := "-"
	if !s.Sandbox.ExpiresAt.IsZero() {
		exp = "+" + s.Sandbox.ExpiresAt.Sub(scriptT0).String()
	}
	state := fmt.Sprintf("state: %s sandbox=%s data=%s restored=%v busy=%v expires=%s",
		s.Stage, sb, s.Sandbox.Data, s.Sandbox.Restored, s.Busy(), exp)
	if s.lends {
		state += fmt.Sprintf(" lent=%v recalling=%v lost=%v", s.lent, s.recalling, s.Lost)
	}
	return state
}

// TestRoundScripts runs testdata/round/*.txt against Round. Each script
// begins with "new id=N sessions=a,b".
func TestRoundScripts(t *testing.T) {
	script.Run(t, "testdata/round/*.txt", func(t *testing.T) func(c *script.Case) string {
		var r *Round
		return func(c *script.Case) string {
			switch c.Cmd {
			case "new":
				id, _ := strconv.ParseUint(c.Args["id"], 10, 64)
				r = NewRound(id, refs(split(c, "sessions")...))
				return roundState(r)
			case "reply":
				round, _ := strconv.ParseUint(c.Args["round"], 10, 64)
				m := &messages.SnapshotReply{Round: round, SessionID: c.Args["session"], SnapshotID: c.Args["snapshot"], Skipped: c.Has("skipped"), Err: scriptErr(c)}
				return fmt.Sprintf("taken: %v\n%s", r.Reply(m), roundState(r))
			case "terminated":
				r.Terminated(c.Words[0])
			case "timeout":
				r.Timeout()
			case "give-up":
				r.GiveUp()
			case "result":
				res := r.Result()
				var taken, failed []string
				for _, s := range res.Taken {
					taken = append(taken, s.SessionID+":"+s.SnapshotID)
				}
				for sid, why := range res.Failed {
					failed = append(failed, fmt.Sprintf("%s: %s", sid, why))
				}
				sort.Strings(failed)
				return fmt.Sprintf("round %d taken=[%s] skipped=[%s]\nfailed:\n  %s", res.Round, strings.Join(taken, " "), strings.Join(res.Skipped, " "), strings.Join(failed, "\n  "))
			default:
				t.Fatalf("%s: unknown command %q", c.Pos, c.Cmd)
			}
			return roundState(r)
		}
	})
}

func roundState(r *Round) string {
	return fmt.Sprintf("state: done=%v ok=%v draining=%v", r.Done(), r.OK(), r.Draining())
}
