package osstack

import (
	"errors"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/internal/flock"
)

// A fault test waiting for the stack exclusively lets no new shared hold
// in: it waits for the holds taken before it only, then the new ones
// follow. A flock alone lets shared holds in while an exclusive one waits,
// and a fault test waited for as long as other tests' holds overlapped.
func TestAWaitingExclusiveHoldGoesBeforeNewSharedOnes(t *testing.T) {
	st := Stack{Dir: t.TempDir()}
	first, err := st.Shared()
	if err != nil {
		t.Fatal(err)
	}
	fault, err := st.holdShared()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = flock.Release(fault) })
	faults, err := st.hold(faultsLock, syscall.LOCK_EX)
	if err != nil {
		t.Fatal(err)
	}
	writer := Stack{Dir: st.Dir, held: fault, fault: &faultHold{f: faults}}
	t.Cleanup(writer.fault.release)

	order := make(chan string, 2)
	waiting, held := make(chan struct{}), make(chan func())
	go func() {
		done := writer.exclusive(t, func() { close(waiting) })
		order <- "exclusive"
		held <- done
	}()
	<-waiting
	// The gate is closed to new shared holds while the exclusive one waits.
	if err := tryGate(st); !errors.Is(err, flock.ErrHeld) {
		t.Fatalf("a new shared hold at the gate while an exclusive one waits: %v, want it refused (ErrHeld)", err)
	}
	later := make(chan func())
	go func() {
		release, err := st.Shared()
		if err != nil {
			t.Error(err)
			release = func() {}
		}
		order <- "shared"
		later <- release
	}()
	first() // the hold taken before the exclusive one ends
	done := <-held
	if err := tryFaults(st); !errors.Is(err, flock.ErrHeld) {
		t.Errorf("the fault lock during the fault: %v, want it held (ErrHeld)", err)
	}
	done()
	(<-later)()
	if diff := cmp.Diff([]string{"exclusive", "shared"}, []string{<-order, <-order}); diff != "" {
		t.Errorf("order of the holds (-want +got):\n%s", diff)
	}
	// The fault is over: the next fault test may take the fault lock.
	if err := tryFaults(st); err != nil {
		t.Errorf("the fault lock once the fault is over: %v, want it free", err)
	}
}

// tryFaults takes the fault lock without waiting, as the next fault test
// would, and lets it go.
func tryFaults(st Stack) error {
	f, err := st.hold(faultsLock, syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return flock.ErrHeld
	}
	if err != nil {
		return err
	}
	return flock.Release(f)
}

// tryGate takes the gate shared without waiting, as a new shared hold
// would, and lets it go.
func tryGate(st Stack) error {
	f, err := st.hold(gateLock, syscall.LOCK_SH|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return flock.ErrHeld
	}
	if err != nil {
		return err
	}
	return flock.Release(f)
}
