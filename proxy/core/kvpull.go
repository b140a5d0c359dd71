package core

import (
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// engineCallErr names a failed engineCall to local as the local engine's
// upstream failure.
func engineCallErr(local string, err error) error {
	return upstreamErr(upstream.RoleEngine, local, err)
}
