//go:build !cgo

package nixl

import "github.com/pd-sidecar/pd-sidecar/kvtransfer"

// New reports that a CGO_ENABLED=0 binary cannot dlopen NIXL's C API.
func New(cfg Config) (kvtransfer.Transport, error) {
	cfg = cfg.withDefaults()
	return nil, missing(cfg.Library, "this binary was built with CGO_ENABLED=0 and cannot dlopen; use the CUDA image")
}
