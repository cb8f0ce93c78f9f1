package osbench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
)

// Profile starts a CPU profile and an execution trace into dir and records
// every blocking event and mutex contention; stop writes cpu.pprof,
// trace.out, block.pprof and mutex.pprof there. Where a run's wall time
// goes when its CPU time is small is what the block profile and the trace
// show.
func Profile(dir string) (stop func() error, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cpu, err := os.Create(filepath.Join(dir, "cpu.pprof"))
	if err != nil {
		return nil, err
	}
	tr, err := os.Create(filepath.Join(dir, "trace.out"))
	if err != nil {
		cpu.Close()
		return nil, err
	}
	if err := pprof.StartCPUProfile(cpu); err != nil {
		cpu.Close()
		tr.Close()
		return nil, err
	}
	if err := trace.Start(tr); err != nil {
		pprof.StopCPUProfile()
		cpu.Close()
		tr.Close()
		return nil, err
	}
	runtime.SetBlockProfileRate(1)
	runtime.SetMutexProfileFraction(1)
	return func() error {
		trace.Stop()
		pprof.StopCPUProfile()
		errs := []error{cpu.Close(), tr.Close()}
		for _, name := range []string{"block", "mutex"} {
			f, err := os.Create(filepath.Join(dir, name+".pprof"))
			if err != nil {
				errs = append(errs, err)
				continue
			}
			errs = append(errs, pprof.Lookup(name).WriteTo(f, 0), f.Close())
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("write the profiles: %w", err)
		}
		return nil
	}, nil
}
