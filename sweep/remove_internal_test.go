package sweep

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// removalsStartBound ends a test whose removals never start: the wait is
// for goroutines to be scheduled (microseconds), so a miss means a hang,
// which this test then reports instead of waiting for the binary's
// timeout.
const removalsStartBound = 30 * time.Second

// Without a parallelism, eight removals run at once, never more, and every
// one runs.
func TestRemovalsRunEightAtOnceByDefault(t *testing.T) {
	ids := make([]string, 12)
	for i := range ids {
		ids[i] = fmt.Sprintf("sb-%02d", i)
	}
	var mu sync.Mutex
	running, most := 0, 0
	started, release := make(chan int, len(ids)), make(chan struct{})
	finished := make(chan []string, 1)
	go func() {
		done, _, _ := removeEach(0, ids, func(i int) error {
			mu.Lock()
			running++
			most = max(most, running)
			mu.Unlock()
			started <- i
			<-release
			mu.Lock()
			running--
			mu.Unlock()
			return nil
		})
		finished <- done
	}()
	bound := time.NewTimer(removalsStartBound)
	defer bound.Stop()
	for n := 0; n < 8; n++ {
		select {
		case <-started:
		case <-bound.C:
			t.Fatalf("%d of 8 removals started within %v", n, removalsStartBound)
		}
	}
	close(release)
	var done []string
	select {
	case done = <-finished:
	case <-bound.C:
		t.Fatalf("the removals did not end within %v of their release", removalsStartBound)
	}
	if len(done) != len(ids) || most != 8 {
		t.Errorf("%d of %d removed, at most %d at once; want all, 8 at once", len(done), len(ids), most)
	}
}
