package core

import (
	"errors"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

var EventStream = []byte("text/event-stream")

// BeforeOutputErr is the error of a leg that failed, or was cut by
// --decode-first-byte-timeout, before it had anything to relay.
func BeforeOutputErr(err error) error { return DecodeTransportErr(err) }

// EndedBefore is the failure of the local engine's stream at addr that
// ended before what it was read for (its first event, its first output),
// for the reason err: the first-byte bound running out
// (upstream.ErrFirstByteTimeout) is the failure the request names for it
// on either driver, whatever the stream had sent; any other is the stream
// that ended early (EndedEarly).
func EndedBefore(addr, what string, err error) error {
	if errors.Is(err, upstream.ErrFirstByteTimeout) {
		return DecodeTransportErr(err)
	}
	return DecodeTransportErr(EndedEarly(addr, what, err))
}

// ReadToOutput reads a stream's events, appended to held, up to its first
// output or error event (error reports the latter), or maxHeld bytes of
// preamble.
func ReadToOutput(er *sse.Reader, api connectors.API, held []byte) ([]byte, bool, error) {
	for {
		ev, err := er.Next()
		if err != nil {
			return held, false, err
		}
		held = append(held, ev...)
		kind := connectors.EventPreamble
		if d := sse.FirstData(ev); d != nil {
			kind = connectors.ClassifyEvent(api, d)
		}
		if kind == connectors.EventPreamble && len(held) < MaxHeld {
			continue
		}
		return held, kind == connectors.EventError, nil
	}
}

// ErrHandedOver ends fasthttp's writing of an answer handed to an event
// loop; fasthttp then closes the connection, which clientconn.Conn turns
// into the loop taking it.
var ErrHandedOver = errors.New("stream handed to an event loop")

// MaxHeld bounds the preamble events held back while waiting for the first
// output of a decode leg.
const MaxHeld = 64 << 10
