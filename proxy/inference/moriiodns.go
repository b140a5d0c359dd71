package inference

import (
	"github.com/pd-sidecar/pd-sidecar/proxy/hostdns"
)

// ErrNoAddress: a host name resolved to no address.
var ErrNoAddress = hostdns.ErrNoAddress

var _ background = (*hostdns.Resolver)(nil)
