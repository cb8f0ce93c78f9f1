package participant_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/participant"
	"github.com/sandboxowner/owner/resources"
	"github.com/sandboxowner/owner/sched"
)

// TestParticipantOnADet: with Config.Runtime a Det, both the admission
// gate and the control machine run on it. A prepare (from the driver)
// closes admission; a request that arrives then parks its coroutine, the
// prepare waits through the Det for the request in flight to leave, and
// after the resume the parked request is admitted.
func TestParticipantOnADet(t *testing.T) {
	det := sched.NewDet(1, t0)
	defer det.Close()
	f := &fakeOwner{}
	p := participant.New(participant.Config{Owner: f, Mode: owner.ModeExported, Instance: "notes", Clock: det, Runtime: det})
	ctx := context.Background()
	var log []string
	// A tool call in flight, which leaves after ten seconds.
	det.Go(func() {
		leave, err := p.Admit(ctx, participant.Tool, &resources.Session{ID: "s1", Episode: control.EpisodeID{RolloutID: "r1"}, HasEpisode: true})
		if err != nil {
			t.Error(err)
			return
		}
		log = append(log, "s1 admitted")
		tm := det.NewTimer(10 * time.Second)
		det.Await(ctx, func() bool { return len(tm.C()) > 0 })
		leave()
		p.Machine().Notify()
	})
	det.Settle()

	b := control.Base{CheckpointID: "c1", DeadlineTS: control.UnixSeconds(t0.Add(time.Minute))}
	// A request that arrives once admission is closed waits.
	det.AfterFunc(time.Second, func() {
		det.Go(func() {
			leave, err := p.Admit(ctx, participant.Tool, &resources.Session{ID: "s2", Episode: control.EpisodeID{RolloutID: "r2"}, HasEpisode: true})
			if err != nil {
				t.Error(err)
				return
			}
			log = append(log, "s2 admitted")
			leave()
		})
	})
	rep, err := p.Machine().Prepare(ctx, control.PrepareRequest{Base: b})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Phase != control.PhasePrepared {
		t.Fatalf("prepare: phase %s, want prepared", rep.Phase)
	}
	if got := det.Now().Sub(t0); got != 10*time.Second {
		t.Fatalf("prepared at %v, want when the request in flight left (10s)", got)
	}
	if diff := cmp.Diff([]string{"s1 admitted"}, log); diff != "" {
		t.Fatalf("while prepared (-want +got):\n%s", diff)
	}
	if got := p.Gate().Waiting(); got != 1 {
		t.Fatalf("%d requests waiting at the closed gate, want 1", got)
	}
	if _, err := p.Machine().Resume(ctx, control.ResumeRequest{Base: b}); err != nil {
		t.Fatal(err)
	}
	det.Settle()
	if diff := cmp.Diff([]string{"s1 admitted", "s2 admitted"}, log); diff != "" {
		t.Fatalf("after the resume (-want +got):\n%s", diff)
	}
}
