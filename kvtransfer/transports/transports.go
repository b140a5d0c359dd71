// Package transports builds a kvtransfer.Transport from its --kv-transport
// name: the one place where transports are registered.
package transports

import (
	"fmt"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer/ucx"
)

// Names lists the transports, in the order help texts show them.
var Names = []string{"tcp", "ucx", "nixl"}

// New returns the transport called name. ucx needs a build with -tags ucx;
// nixl is not implemented yet. Either is one error wrapping
// kvtransfer.ErrUnsupported.
func New(name string) (kvtransfer.Transport, error) {
	switch name {
	case "tcp":
		return kvtransfer.NewTCPTransport(kvtransfer.TCPConfig{}), nil
	case "ucx":
		return ucx.New()
	case "nixl":
		return nil, fmt.Errorf("--kv-transport nixl: %w: the NIXL binding (libnixl_capi.so, NIXL_CAPI_LIB) is not implemented yet", kvtransfer.ErrUnsupported)
	}
	return nil, fmt.Errorf("--kv-transport %q is not one of tcp, ucx, nixl: %w", name, kvtransfer.ErrUnsupported)
}
