package inference

import (
	"github.com/pd-sidecar/pd-sidecar/proxy/hostdns"
)

var _ background = (*hostdns.Resolver)(nil)
