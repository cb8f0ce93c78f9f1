package engine

import (
	"bytes"
	"io/fs"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/records"
)

// The controller deleting checkpoint directories: the owner drops their
// checkpoints in time and nothing else, on seeds where drops happen.
func TestDirGoneFaultIsFollowed(t *testing.T) {
	fired, drops := 0, 0
	dropped := regexp.MustCompile(`retention check: dropped \[c`)
	for seed := int64(1); seed <= 8; seed++ {
		var trace bytes.Buffer
		res := Run(seed, Config{Sessions: 3, Steps: 40, Faults: Faults{FaultDirGone: 1, FaultCrash: 0.05}, TempDir: t.TempDir(), Trace: &trace})
		for _, v := range res.Violations {
			t.Errorf("seed %d: %s", seed, v)
		}
		fired += res.Fired[FaultDirGone]
		drops += len(dropped.FindAllIndex(trace.Bytes(), -1))
	}
	if fired == 0 || drops == 0 {
		t.Fatalf("directories deleted %d times, %d checks dropped something: the fault never exercised the owner", fired, drops)
	}
}

// runRetentionSabotaged runs seeds with directories deleted until the fault
// fires, with every owner's configuration changed by sabotage.
func runRetentionSabotaged(t *testing.T, sabotage func(c *owner.Config, r *run)) []Violation {
	t.Helper()
	for seed := int64(1); seed <= 20; seed++ {
		r := newRun(seed, Config{Sessions: 3, Steps: 40, Faults: Faults{FaultDirGone: 1}, TempDir: t.TempDir()})
		r.sabotageOwner = func(c *owner.Config) { sabotage(c, r) }
		res := r.exec()
		if res.Fired[FaultDirGone] > 0 {
			return res.Violations
		}
	}
	t.Fatal("no seed deleted a checkpoint directory")
	return nil
}

// An owner that does not follow the directories, or waits longer than
// the grace, keeps a gone one's checkpoint past the grace and the period:
// the check sees it.
func TestNotFollowingIsCaught(t *testing.T) {
	for name, sabotage := range map[string]func(c *owner.Config, _ *run){
		"not following": func(c *owner.Config, _ *run) { c.Checkpoint.Retention.FollowDirs = false },
		"a longer grace": func(c *owner.Config, _ *run) {
			c.Checkpoint.Retention.Grace = retentionGrace + retentionPeriod + time.Second
		},
	} {
		t.Run(name, func(t *testing.T) {
			vs := runRetentionSabotaged(t, sabotage)
			if len(vs) != 1 || vs[0].Invariant != FollowsRetention || !strings.Contains(vs[0].Detail, "the index still holds it") {
				t.Fatalf("violations %v, want the gone checkpoint kept too long", vs)
			}
		})
	}
}

// everythingGone answers every checkpoint directory as gone: an owner
// that believes it drops checkpoints whose directories are there.
type everythingGone struct{ *records.MemFS }

func (e everythingGone) Lstat(name string) (fs.FileInfo, error) {
	if strings.HasPrefix(name, "/ck/") {
		return nil, &fs.PathError{Op: "lstat", Path: name, Err: syscall.ENOENT}
	}
	return e.MemFS.Lstat(name)
}

// A check that drops a checkpoint whose directory is there is caught at
// that check.
func TestDroppingAPresentDirectoryIsCaught(t *testing.T) {
	for seed := int64(1); seed <= 40; seed++ {
		r := newRun(seed, Config{Sessions: 3, Steps: 80, Faults: Faults{FaultDirGone: 0.3}, TempDir: t.TempDir()})
		r.sabotageOwner = func(c *owner.Config) { c.Checkpoint.Retention.Dirs = everythingGone{r.ckdirs} }
		vs := r.exec().Violations
		if len(vs) > 0 && vs[0].Invariant == FollowsRetention && strings.Contains(vs[0].Detail, "whose directory is there") {
			return
		}
	}
	t.Fatal("no seed caught a check that dropped a checkpoint whose directory is there")
}
