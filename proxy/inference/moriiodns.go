package inference

import (
	"context"

	"github.com/pd-sidecar/pd-sidecar/proxy/hostdns"
)

// ErrNoAddress: a host name resolved to no address.
var ErrNoAddress = hostdns.ErrNoAddress

// PickIP is the address of a host spec: the spec itself when it is a
// literal IP, else the first IPv4 address lookup gives, else its first
// (hostdns.PickIP).
func PickIP(ctx context.Context, lookup hostdns.LookupFunc, spec string) (string, error) {
	return hostdns.PickIP(ctx, lookup, spec)
}

var _ background = (*hostdns.Resolver)(nil)
