package engine

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// Fault is one kind of fault the simulation injects.
type Fault string

// The fault kinds. Crash kinds freeze the owner at a provider
// call and abandon it; the next step runs on a fresh owner over the same
// state_dir and fake backend.
const (
	// FaultCrash: the owner crashes between two steps.
	FaultCrash Fault = "crash"
	// FaultCrashSeed: the owner crashes mid-seed, after the sandbox
	// started and before its setup returned.
	FaultCrashSeed Fault = "crash-seed"
	// FaultCrashCommit: the owner crashes mid-commit, after k of n
	// snapshots (k < n).
	FaultCrashCommit Fault = "crash-commit"
	// FaultCrashCommitIndex: the owner crashes after the last snapshot of
	// a commit, before the index transaction.
	FaultCrashCommitIndex Fault = "crash-commit-index"
	// FaultCrashPark: the owner crashes while a stop commit parks the
	// exported sandboxes (after the index transaction).
	FaultCrashPark Fault = "crash-park"
	// FaultCrashRestore: the owner crashes mid-restore, after k of n forks.
	FaultCrashRestore Fault = "crash-restore"
	// FaultCrashRelease: the owner crashes mid-release, between the
	// tombstones and the deletes (or after k of n deletes).
	FaultCrashRelease Fault = "crash-release"
	// FaultCrashEnd: the owner crashes while a verify or close stops the
	// session's sandbox.
	FaultCrashEnd Fault = "crash-end"
	// FaultLease: the owner stays down past the TTL, so the backend reaps
	// the old sandboxes before the fresh owner starts.
	FaultLease Fault = "lease"
	// FaultSnapshotFail: a snapshot fails before its effect.
	FaultSnapshotFail Fault = "snapshot-fail"
	// FaultSnapshotFailAfter: a snapshot is taken but its call fails.
	FaultSnapshotFailAfter Fault = "snapshot-fail-after"
	// FaultLatency: a snapshot hangs past the commit's deadline.
	FaultLatency Fault = "latency"
	// FaultForkFail: a restore's fork fails before its effect.
	FaultForkFail Fault = "fork-fail"
	// FaultForkFailAfter: a fork is made but its call fails.
	FaultForkFailAfter Fault = "fork-fail-after"
	// FaultStartFailAfter: a seed's start makes its sandbox but its call
	// fails.
	FaultStartFailAfter Fault = "start-fail-after"
	// FaultStopFail: a sandbox stop fails (end, retire, park, rollback,
	// supersede, startup sweep, a failed setup's cleanup).
	FaultStopFail Fault = "stop-fail"
	// FaultDeleteFail: a snapshot delete fails.
	FaultDeleteFail Fault = "delete-fail"
	// FaultSetupFail: a session's setup fails after writing its token.
	FaultSetupFail Fault = "setup-fail"
	// FaultDrift: a session moves on after a checkpoint, then the owner
	// crashes and the checkpoint is restored.
	FaultDrift Fault = "drift"
	// FaultResentVerify: a verify is sent again after the session ended.
	FaultResentVerify Fault = "resent-verify"
	// FaultRace: a seed and an end race a commit.
	FaultRace Fault = "race"
	// FaultLost: a session's sandbox is deleted behind the owner's back
	// (stopped at the provider, as a lease reaper or an operator would)
	// before its tool call and its verify.
	FaultLost Fault = "lost"
	// FaultMachineLost: a crashed owner's machine is gone with its
	// state_dir; a fresh owner on an empty one restores the latest
	// checkpoint from its records in the controller's checkpoint_dir, and
	// a release that keeps only it reclaims what the earlier runs left.
	FaultMachineLost Fault = "machine-lost"
	// FaultDirGone: the controller deletes checkpoint directories, as NeMo
	// Gym's collection checkpointer does with all but its newest ones,
	// and never releases them: the owner must drop their checkpoints
	// within the grace and one check period, and nothing else.
	FaultDirGone Fault = "dir-gone"
)

// defaultRates gives every fault kind its default rate: the chance that a
// step where it applies injects it.
func defaultRates() map[Fault]float64 {
	return map[Fault]float64{
		FaultCrash:             0.04,
		FaultCrashSeed:         0.06,
		FaultCrashCommit:       0.08,
		FaultCrashCommitIndex:  0.05,
		FaultCrashPark:         0.15,
		FaultCrashRestore:      0.10,
		FaultCrashRelease:      0.10,
		FaultCrashEnd:          0.04,
		FaultLease:             0.30,
		FaultSnapshotFail:      0.08,
		FaultSnapshotFailAfter: 0.08,
		FaultLatency:           0.04,
		FaultForkFail:          0.10,
		FaultForkFailAfter:     0.10,
		FaultStartFailAfter:    0.06,
		FaultStopFail:          0.08,
		FaultDeleteFail:        0.10,
		FaultSetupFail:         0.06,
		FaultDrift:             0.10,
		FaultResentVerify:      0.30,
		FaultRace:              0.12,
		FaultLost:              0.10,
		FaultMachineLost:       0.15,
		FaultDirGone:           0.30,
	}
}

// Faults maps each enabled fault kind to its rate.
type Faults map[Fault]float64

// Kinds are the fault kinds, sorted.
func Kinds() []Fault {
	out := make([]Fault, 0, len(defaultRates()))
	for f := range defaultRates() {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// DefaultFaults enables every kind at its default rate.
func DefaultFaults() Faults {
	return Faults(defaultRates())
}

// ParseFaults reads the -faults flag: "all" (every kind at its default
// rate), "none", or a comma-separated list of kind or kind=rate, where a
// list may start with "all" to adjust the defaults ("all,crash=0.2,race=0").
func ParseFaults(s string) (Faults, error) {
	s = strings.TrimSpace(s)
	switch s {
	case "", "all":
		return DefaultFaults(), nil
	case "none":
		return Faults{}, nil
	}
	f := Faults{}
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "all" && i == 0 {
			f = DefaultFaults()
			continue
		}
		name, rate, hasRate := strings.Cut(part, "=")
		k := Fault(name)
		def, ok := defaultRates()[k]
		if !ok {
			return nil, fmt.Errorf("unknown fault kind %q (kinds: %s)", name, strings.Join(kindNames(), ", "))
		}
		r := def
		if hasRate {
			v, err := strconv.ParseFloat(rate, 64)
			if err != nil || v < 0 || v > 1 {
				return nil, fmt.Errorf("fault %s: rate %q is not a number in [0, 1]", name, rate)
			}
			r = v
		}
		if r == 0 {
			delete(f, k)
			continue
		}
		f[k] = r
	}
	return f, nil
}

func kindNames() []string {
	var out []string
	for _, k := range Kinds() {
		out = append(out, string(k))
	}
	return out
}

// String is the flag form of f.
func (f Faults) String() string {
	if len(f) == 0 {
		return "none"
	}
	all := DefaultFaults()
	same := len(f) == len(all)
	for k, v := range all {
		if f[k] != v {
			same = false
		}
	}
	if same {
		return "all"
	}
	var parts []string
	for _, k := range Kinds() {
		if r, ok := f[k]; ok {
			parts = append(parts, fmt.Sprintf("%s=%g", k, r))
		}
	}
	return strings.Join(parts, ",")
}

// Config is what one run does.
type Config struct {
	// Sessions is how many session ids the workload uses.
	Sessions int
	// Steps is how many workload steps a run takes (the final clean-up
	// comes on top).
	Steps int
	// Faults are the enabled fault kinds and their rates.
	Faults Faults
	// Trace, when set, receives a line per step and the owner's warnings.
	Trace io.Writer
	// TempDir is where the run's state_dir is made ("" for the default).
	TempDir string
	// Provider is what the owner drives: "fake" (default: the fake
	// provider itself) or "opensandbox" (the OpenSandbox client, over HTTP,
	// against the fake OpenSandbox server whose runtime is the same fake,
	// so faults and checks are unchanged).
	Provider string
	// Keyed adds the keyed workload: groups of seeds of one task key
	// forking its template, and templates expiring, with warm pools of
	// keyedPoolSize in the owner. Off, a seed's run is what it was before
	// the keyed workload existed.
	Keyed bool
	// Runtime is the sched.Runtime the owner's concurrency runs on (the
	// -mode flag): RuntimeDeterministic (default: one seeded scheduler on
	// virtual time, so a seed replays exactly) or RuntimeReal (goroutines,
	// as in the server). The OpenSandbox provider, which talks HTTP, runs
	// only on RuntimeReal.
	Runtime string
}

// The runtimes, by their -mode names.
const (
	RuntimeDeterministic = "deterministic"
	RuntimeReal          = "real-goroutines"
)

func (c Config) withDefaults() Config {
	if c.Runtime == "" {
		c.Runtime = RuntimeDeterministic
		if c.Provider == ProviderOpenSandbox {
			c.Runtime = RuntimeReal
		}
	}
	if c.Sessions <= 0 {
		c.Sessions = 4
	}
	if c.Steps <= 0 {
		c.Steps = 40
	}
	if c.Faults == nil {
		c.Faults = Faults{}
	}
	return c
}
