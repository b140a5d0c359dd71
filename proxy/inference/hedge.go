package inference

import (
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
)

// errHedgeLost is the cause a losing leg is cancelled with.
var errHedgeLost = split.ErrHedgeLost
