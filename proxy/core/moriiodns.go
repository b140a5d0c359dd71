package core

import (
	"github.com/pd-sidecar/pd-sidecar/proxy/hostdns"
)

var _ Background = (*hostdns.Resolver)(nil)
