package core

import (
	"errors"
	"fmt"

	"github.com/pd-sidecar/pd-sidecar/proxy/bootstrap"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// bootstrapTransportErr names a bootstrap query to addr that failed in the
// transport (bootstrap.TransportErr): an answer the transport refused is
// bootstrap.ErrFailed; one that never came (unreachable, timed out) is the
// prefiller's transport error.
func bootstrapTransportErr(addr string, err error) error {
	ue := upstreamErr(upstream.RoleBootstrap, addr, err)
	if errors.Is(err, upstream.ErrBadUpstreamAnswer) {
		return fmt.Errorf("%w: %w", bootstrap.ErrFailed, ue)
	}
	return PrefillTransportErr(ue) // unreachable, timed out: as the prefiller
}
