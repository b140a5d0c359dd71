//go:build !ucx

package ucx

import (
	"fmt"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
)

// New reports that this binary was built without UCX.
func New() (kvtransfer.Transport, error) {
	return nil, fmt.Errorf("--kv-transport ucx: %w: this binary was built without -tags ucx (needs libucx-dev)", kvtransfer.ErrUnsupported)
}

// Version is empty: this binary was built without UCX.
func Version() string { return "" }
