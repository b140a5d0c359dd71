//go:build cgo

package nixl

import "time"

// SetDrainTimeout sets how long a's Release waits for a running transfer.
func SetDrainTimeout(a *Agent, d time.Duration) { a.drain = d }
