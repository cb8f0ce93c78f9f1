package actors

import (
	"github.com/asynkron/protoactor-go/actor"

	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
)

// kinds names the effects Step returned, for the session scripts
// (testdata/session).
func kinds(effects []any) []string {
	var out []string
	for _, e := range effects {
		switch e := e.(type) {
		case effStart:
			out = append(out, "start")
		case effDo:
			out = append(out, "do")
		case effSnapshot:
			out = append(out, "snapshot")
		case effStop:
			out = append(out, "stop:"+string(e.Reason))
		case effRenew:
			out = append(out, "renew")
		case effHeld:
			out = append(out, "held")
		case effLend:
			out = append(out, "lend")
		case effRecall:
			out = append(out, "recall")
		case effLost:
			out = append(out, "lost")
		case effEnded:
			out = append(out, "ended:"+string(e.Reason))
		case effReply:
			switch m := e.Msg.(type) {
			case *messages.StartReply:
				switch {
				case m.Err != nil:
					out = append(out, "reply:start-err")
				case m.Existing:
					out = append(out, "reply:start-existing")
				default:
					out = append(out, "reply:start-ok")
				}
			case *messages.DoReply:
				if m.Err != nil {
					out = append(out, "reply:do-err")
				} else {
					out = append(out, "reply:do-ok")
				}
			case *messages.SnapshotReply:
				switch {
				case m.Skipped:
					out = append(out, "reply:snapshot-skipped")
				case m.Err != nil:
					out = append(out, "reply:snapshot-err")
				default:
					out = append(out, "reply:snapshot-ok")
				}
			case *messages.StopReply:
				switch {
				case m.Err != nil:
					out = append(out, "reply:stop-err")
				case m.NotIdle:
					out = append(out, "reply:stop-not-idle")
				default:
					out = append(out, "reply:stop-ok")
				}
			case *messages.GetSandboxReply:
				view := "reply:view"
				for _, f := range []struct {
					on   bool
					name string
				}{{m.Held, "held"}, {m.Starting, "starting"}, {m.Lost, "lost"}} {
					if f.on {
						view += ":" + f.name
					}
				}
				out = append(out, view)
			}
		}
	}
	return out
}

func sandboxOf(id string) sandbox.Sandbox {
	return sandbox.Sandbox{Handle: provider.Handle{SandboxID: id, Provider: "fake"}, Workdir: "/w", Data: []byte("{}")}
}

// refs are session refs with pids pid-<id>, for the round scripts
// (testdata/round).

func refs(ids ...string) []messages.SessionRef {
	out := make([]messages.SessionRef, len(ids))
	for i, id := range ids {
		out[i] = messages.SessionRef{SessionID: id, PID: actor.NewPID("local", "pid-"+id)}
	}
	return out
}
