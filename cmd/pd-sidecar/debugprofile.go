package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
)

// debugProfileEnv names a directory where, for debugging only, pd-sidecar
// writes a CPU profile of its whole run (cpu-PORT.pprof) and, when it
// stops, its allocation profile (allocs-PORT.pprof). It is for profiling
// under pd-bench (docs/performance.md: every sidecar the suite starts
// inherits it and writes its own files); not a flag, not for production.
const debugProfileEnv = "PD_SIDECAR_DEBUG_PROFILE_DIR"

// startDebugProfile starts the CPU profile when dir is set and returns what
// ends it and writes the allocation profile.
func startDebugProfile(dir string, port int) (stop func(), err error) {
	if dir == "" {
		return func() {}, nil
	}
	cpu, err := os.Create(filepath.Join(dir, fmt.Sprintf("cpu-%d.pprof", port)))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", debugProfileEnv, err)
	}
	if err := pprof.StartCPUProfile(cpu); err != nil {
		cpu.Close()
		return nil, fmt.Errorf("%s: %w", debugProfileEnv, err)
	}
	return func() {
		pprof.StopCPUProfile()
		cpu.Close()
		if f, err := os.Create(filepath.Join(dir, fmt.Sprintf("allocs-%d.pprof", port))); err == nil {
			_ = pprof.Lookup("allocs").WriteTo(f, 0)
			f.Close()
		}
	}, nil
}
