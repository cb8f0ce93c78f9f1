package local

import "sync"

// probeResults remembers what New's probes found (containers, overlayfs,
// each limit), for providers made one after another on one host, which
// would each find the same: a package's tests make about a hundred, and
// the probes start the server's binary, touch memory and spin a CPU. A
// server makes one provider and probes once anyway.
type probeResults struct {
	mu   sync.Mutex
	done map[string]error
}

func newProbeResults() *probeResults { return &probeResults{done: map[string]error{}} }

// run returns what f returned the first time name was probed, running it
// now if it never was; with no results kept (nil) it always runs f.
func (r *probeResults) run(name string, f func() error) error {
	if r == nil {
		return f()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err, ok := r.done[name]; ok {
		return err
	}
	err := f()
	r.done[name] = err
	return err
}
