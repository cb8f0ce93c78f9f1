package retention

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxowner/owner/internal/script"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// The scripts in testdata/machine drive one Machine each:
//
//	grace d=300s                    sets the grace
//	check at=10s id=dir:obs ...     one Step at t0+at; obs is present,
//	                                gone or an unreadable reason, with
//	                                @dev for the parent's device; a
//	                                checkpoint without a directory is id=
//
// and print the decision: drops, pending checkpoints (since and due as
// offsets from t0), unreadable ones (first when the previous check saw the
// directory otherwise) and when the next drop is due.
func TestMachineScripts(t *testing.T) {
	script.Run(t, "testdata/machine/*.txt", func(t *testing.T) func(c *script.Case) string {
		m := &Machine{}
		return func(c *script.Case) string {
			switch c.Cmd {
			case "grace":
				d, err := time.ParseDuration(c.Args["d"])
				if err != nil {
					return "bad grace: " + err.Error()
				}
				m.Grace = d
				return "ok"
			case "check":
				at, err := time.ParseDuration(c.Args["at"])
				if err != nil {
					return "bad at: " + err.Error()
				}
				var ckpts []Checkpoint
				for _, w := range c.Words {
					id, v, _ := strings.Cut(w, "=")
					if id == "at" {
						continue
					}
					ck, err := parseCheckpoint(id, v)
					if err != nil {
						return err.Error()
					}
					ckpts = append(ckpts, ck)
				}
				return render(m.Step(ckpts, t0.Add(at)))
			}
			return "unknown command " + c.Cmd
		}
	})
}

func parseCheckpoint(id, v string) (Checkpoint, error) {
	if v == "" {
		return Checkpoint{ID: id}, nil
	}
	dir, obs, ok := strings.Cut(v, ":")
	if !ok {
		return Checkpoint{}, fmt.Errorf("%s: want dir:observation", id)
	}
	var o Observation
	status, dev, hasDev := strings.Cut(obs, "@")
	if hasDev {
		n, err := strconv.ParseUint(dev, 10, 64)
		if err != nil {
			return Checkpoint{}, err
		}
		o.ParentDev = n
	}
	switch status {
	case "present":
		o.Status = Present
	case "gone":
		o.Status = Gone
	default:
		o.Status, o.Reason, o.Detail = Unreadable, status, "errno"
	}
	return Checkpoint{ID: id, Dir: dir, Obs: o}, nil
}

func render(d Decision) string {
	var b strings.Builder
	off := func(at time.Time) string { return at.Sub(t0).String() }
	for _, id := range d.Drop {
		fmt.Fprintf(&b, "drop %s\n", id)
	}
	for _, p := range d.Pending {
		fmt.Fprintf(&b, "pending %s %s since=%s due=%s\n", p.ID, p.Dir, off(p.Since), off(p.Due))
	}
	for _, p := range d.Unreadable {
		first := ""
		if p.First {
			first = " first"
		}
		fmt.Fprintf(&b, "unreadable %s %s %s%s\n", p.ID, p.Dir, p.Reason, first)
	}
	if !d.Next.IsZero() {
		fmt.Fprintf(&b, "next %s\n", off(d.Next))
	}
	if b.Len() == 0 {
		return "nothing"
	}
	return b.String()
}
