// Package nixl is kvtransfer's nixl transport: our own thin binding of
// NIXL's C API (the nixl_capi_* functions of NIXL's src/bindings/rust
// wrapper, built as libnixl_capi.so by scripts/build-nixl.sh, which
// Dockerfile.cuda runs). The library is
// loaded with dlopen at run time, never linked, so every build compiles
// (cgo is needed for dlopen; a CGO_ENABLED=0 build reports ErrLibraryMissing)
// and a missing library or symbol is one clear error naming the library and
// NIXL_CAPI_LIB.
//
// The prototypes are declared in capi.h from NIXL's wrapper.h; no NIXL
// header is needed to build. The tests run the binding against a fake
// library with the same symbols, built with the C compiler, and, with
// NIXL_CAPI_LIB set (make test-nixl), against the real one.
package nixl

import (
	"errors"
	"fmt"
	"time"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
)

// DefaultLibrary is the library opened when Config.Library is empty; the
// dynamic loader searches LD_LIBRARY_PATH and the system paths for it.
const DefaultLibrary = "libnixl_capi.so"

// DefaultBackend is the NIXL backend plugin used when Config.Backend is
// empty.
const DefaultBackend = "UCX"

// DefaultProgressDelay is the poll timeout of an agent's progress thread
// when Config.ProgressDelay is zero. The thread wakes at once on the
// backend's events; the timeout only bounds a missed wake-up. NIXL's own
// default, 0, makes the thread spin: a busy core per agent, idle or not.
const DefaultProgressDelay = time.Millisecond

// DefaultDrainTimeout bounds how long releasing a transfer that is still
// running (a cancelled or timed-out read) waits for it to end: NIXL's
// release does not stop the data, so the transport lets it land before the
// destination memory is given back.
const DefaultDrainTimeout = 10 * time.Second

// ErrLibraryMissing: libnixl_capi.so (or the path given) could not be
// loaded, lacks a nixl_capi_* symbol the binding needs, or is NIXL's stub
// build. Errors wrapping it also wrap kvtransfer.ErrUnsupported.
var ErrLibraryMissing = errors.New("nixl: NIXL C API library unavailable")

// ErrCall: a nixl_capi_* call returned an error status (see CallError).
var ErrCall = errors.New("nixl: call failed")

// Config configures the nixl transport. The zero value is usable.
type Config struct {
	// Library is the path or file name of NIXL's C API library (default
	// DefaultLibrary). cmd/pd-sidecar sets it from NIXL_CAPI_LIB; this
	// package reads no environment.
	Library string
	// Backend is the NIXL backend plugin the agents create (default
	// DefaultBackend, "UCX"), with the plugin's default parameters. NIXL
	// finds its plugins through NIXL_PLUGIN_DIR, which NIXL reads itself.
	Backend string
	// AgentPrefix starts every NIXL agent name (default "pd-sidecar"); the
	// host name, the process id and a random suffix follow, so names are
	// unique across the fleet.
	AgentPrefix string
	// ProgressDelay is the poll timeout of each agent's progress thread
	// (default DefaultProgressDelay; NIXL rounds it up to whole
	// milliseconds). Libraries older than NIXL 0.6.1 lack
	// nixl_capi_create_configured_agent and get NIXL's default instead.
	ProgressDelay time.Duration
}

func (c Config) withDefaults() Config {
	if c.Library == "" {
		c.Library = DefaultLibrary
	}
	if c.Backend == "" {
		c.Backend = DefaultBackend
	}
	if c.AgentPrefix == "" {
		c.AgentPrefix = "pd-sidecar"
	}
	if c.ProgressDelay <= 0 {
		c.ProgressDelay = DefaultProgressDelay
	}
	return c
}

// missing builds the one startup error for an unusable library.
func missing(path, why string) error {
	return fmt.Errorf("--kv-transport nixl: %w: %w: cannot use %q (%s); install NIXL with its C API (the CUDA image ships /opt/nixl/lib/libnixl_capi.so) and point NIXL_CAPI_LIB at it",
		kvtransfer.ErrUnsupported, ErrLibraryMissing, path, why)
}
