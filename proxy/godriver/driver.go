// Package godriver is the goroutine driver: it runs the split of a request
// that fasthttp's handler goroutine serves, under the choreography its
// connector declares (sequential with its retries, hedge and fallback;
// concurrent; decode-first; MoRI-IO's parallel dispatch). The decisions are
// the split machines' (proxy/split) and the request's state is
// proxy/inference's; this package does the machines' I/O with goroutines
// and channels, as the lane (proxy/lane) does it on the event loops.
package godriver

import "github.com/pd-sidecar/pd-sidecar/proxy/relay"

// Split runs the split of r on its handler goroutine and answers the
// client (an core.Splitter).
func Split(r *relay.Exchange) {
	if choreograph(r) {
		return
	}
	runSequential(r)
}
