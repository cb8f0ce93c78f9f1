package swebench

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
)

// execOnly is a provider whose every command ends as res, err: a sandbox
// whose init could not start, or a command killed by its timeout.
type execOnly struct {
	provider.Provider
	res provider.ExecResult
	err error
}

func (p execOnly) Exec(context.Context, provider.Handle, provider.ExecRequest) (provider.ExecResult, error) {
	return p.res, p.err
}

// A scrub that could not run refuses the seed, where one that ran and
// refused the repository lets it go on (TestAFailingScrubIsReportedAndTheSeedGoesOn):
// the refs it would have removed, the fix's commit among them, would be
// graded as the agent's committed work, so a machine too slow to start the
// scrub turned a session that changed nothing into a reward of 1.
func TestAScrubThatCouldNotRunRefusesTheSeed(t *testing.T) {
	t.Parallel()
	cases := map[string]execOnly{
		"the provider fails its command": {err: errors.New("start the sandbox's init: wait for the init: context deadline exceeded")},
		"it times out":                   {res: provider.ExecResult{ExitCode: -1, TimedOut: true, Stdout: "GIT_CLEANUP base=1"}},
	}
	row := Row{InstanceID: "example__calc-1", Repo: "example/calc", BaseCommit: strings.Repeat("ab", 20)}
	for name, p := range cases {
		t.Run(name, func(t *testing.T) {
			s := &Server{}
			data, err := s.setup(row, "image", testLogger(t))(context.Background(), p, sandbox.Sandbox{})
			if !errors.Is(err, ErrScrub) || !errors.Is(err, errScrubNotRun) || data != nil {
				t.Errorf("setup: data %s, err %v; want the seed refused with ErrScrub", data, err)
			}
		})
	}
}
