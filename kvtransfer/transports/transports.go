// Package transports builds a kvtransfer.Transport from its --kv-transport
// name: the one place where transports are registered.
package transports

import (
	"fmt"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer/nixl"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer/ucx"
)

// Names lists the transports, in the order help texts show them.
var Names = []string{"tcp", "ucx", "nixl"}

// Options carry what some transports need from the command line or the
// environment (read in cmd/ only).
type Options struct {
	// NIXLLibrary is NIXL's C API library for nixl: the value of
	// NIXL_CAPI_LIB (empty: libnixl_capi.so from the loader's search path).
	NIXLLibrary string
}

// New returns the transport called name with default Options.
func New(name string) (kvtransfer.Transport, error) { return NewWith(name, Options{}) }

// NewWith returns the transport called name. ucx needs a build with
// -tags ucx; nixl loads NIXL's C API library now, so a missing library is
// a startup error. Either is one error wrapping kvtransfer.ErrUnsupported.
func NewWith(name string, o Options) (kvtransfer.Transport, error) {
	switch name {
	case "tcp":
		return kvtransfer.NewTCPTransport(kvtransfer.TCPConfig{}), nil
	case "ucx":
		return ucx.New()
	case "nixl":
		tr, err := nixl.New(nixl.Config{Library: o.NIXLLibrary})
		if err != nil {
			return nil, err
		}
		return tr, nil
	}
	return nil, fmt.Errorf("--kv-transport %q is not one of tcp, ucx, nixl: %w", name, kvtransfer.ErrUnsupported)
}
