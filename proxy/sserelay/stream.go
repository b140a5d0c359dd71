// Package sserelay is the I/O-free core of an event loop's relay of an
// engine's SSE answer: from the body bytes read off the upstream
// connection (its framing included) it makes the bytes to write to the
// client, the events cut at the bound (sse.Bound) and rewritten, and tells
// what it saw on the way: the first output, [DONE], an event past the
// bound (sse.ErrEventTooLong), bytes after the body. It keeps the gate that
// holds a stream back until its first event, or its first output.
//
// It makes no system call and knows nothing of requests, connections,
// metrics or logs: its caller reads the upstream, writes the client, and
// decides what the events it was told of mean for its request.
package sserelay

import (
	"bytes"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/httpbody"
	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
)

// Stream is the relay state of one answer: its body decoder, the start of
// an event not yet whole, and its gate. Set Body (and the other fields the
// answer needs) before its first bytes are fed. A Stream is for one
// goroutine at a time.
type Stream struct {
	// Body decodes the answer's body framing (chunked, a length, or to the
	// connection's close).
	Body httpbody.Decoder
	// Rewrite, when set, rewrites each event's data payloads (sse.Rewrite).
	Rewrite func([]byte) []byte
	// API is the answer's API, whose events a gate at GateHolding classifies.
	API connectors.API
	// MaxEvent bounds one event (0: the default; sse.Bound).
	MaxEvent int
	// Gate is where a held stream is. A stream is held back, as the
	// goroutine path's relay holds it, until its first event
	// (GateFirstEvent), or for a decode leg carrying remote KV its first
	// output (GateHolding): an error event before any output is a KV load
	// failure, which the client must not see; or, for a decode-first
	// leg, until it says whether the engine serves the request
	// (GateDeciding, with Declines). The events fed move it on; what
	// becomes of the bytes held meanwhile is the caller's.
	Gate Gate
	// Declines, for a gate at GateDeciding, reports whether an event's
	// data declines the request (connectors.DecodeFirst.Declined).
	Declines func(data []byte) bool

	events  bool   // an event was emitted
	done    bool   // [DONE] seen
	excess  bool   // bytes came after the body
	output  bool   // the first output was told (TakeFirstOutput) or recorded (MarkOutput)
	first   bool   // the first output came and was not taken yet
	partial []byte // the start of an event not yet whole
	scanned int    // partial's bytes up to its last line's start
}

// Gate is where a held stream is (see Stream.Gate).
type Gate uint8

const (
	GateOff        Gate = iota // nothing held: every byte goes to the client
	GateHolding                // no event with output yet
	GateFirstEvent             // no event yet
	GateOutput                 // the first output (or event) came, or enough preamble was held
	GateError                  // an error event came before any output
	GateDeciding               // a decode-first leg's: no event that serves or declines yet
	GateDeclined               // a decode-first leg's: an event declined the request
)

// Shut reports whether g holds the stream back.
func (g Gate) Shut() bool { return g == GateHolding || g == GateFirstEvent || g == GateDeciding }

// FeedRaw decodes raw body bytes (framing included) and appends their
// events to out. Bytes after the body's end are not events: Excess then
// reports them.
func (s *Stream) FeedRaw(out, raw []byte) ([]byte, error) {
	for len(raw) > 0 && !s.Body.Done() {
		data, n, err := s.Body.Next(raw, len(raw))
		if err != nil {
			return out, err
		}
		raw = raw[n:]
		if out, err = s.Feed(out, data); err != nil {
			return out, err
		}
	}
	if len(raw) > 0 {
		s.excess = true // bytes after the body: no answer to anything sent
	}
	return out, nil
}

// Feed cuts body bytes into events (as sse.Reader does: each up to its
// blank line, stray blank lines dropped) and appends them to out, keeping
// an incomplete last event for the next call. An event longer than the
// bound (sse.Bound) ends the stream: sse.ErrEventTooLong, the events
// before it appended.
func (s *Stream) Feed(out, data []byte) ([]byte, error) {
	if len(data) == 0 {
		return out, nil
	}
	limit := sse.Bound(s.MaxEvent)
	start, pos := 0, 0
	if len(s.partial) > 0 {
		s.partial = append(s.partial, data...)
		data = s.partial
		pos = s.scanned // its whole lines were looked at already
	}
	for {
		i := bytes.IndexByte(data[pos:], '\n')
		if i < 0 {
			break
		}
		end := pos + i + 1
		if sse.IsBlank(data[pos:end]) {
			if end-start > limit {
				s.partial, s.scanned = nil, 0
				return out, sse.ErrEventTooLong
			}
			if len(bytes.TrimSpace(data[start:pos])) > 0 {
				out = s.emit(out, data[start:end])
			}
			start = end
		}
		pos = end
	}
	rest := data[start:]
	s.scanned = pos - start
	switch {
	case len(rest) > limit:
		s.partial, s.scanned = nil, 0
		return out, sse.ErrEventTooLong
	case len(rest) == 0:
		s.partial = nil
	case len(s.partial) > 0:
		s.partial = s.partial[:copy(s.partial, rest)]
	default:
		s.partial = append([]byte(nil), rest...)
	}
	return out, nil
}

func (s *Stream) emit(out, ev []byte) []byte {
	d := sse.FirstData(ev)
	s.events = true
	switch {
	case s.Gate == GateDeciding:
		// As the goroutine path reads a decode-first answer: the first
		// event with data that declines, or is more than preamble (an
		// error event included), decides.
		if d != nil {
			switch {
			case s.Declines(d):
				s.Gate = GateDeclined
			case connectors.ClassifyEvent(s.API, d) != connectors.EventPreamble:
				s.Gate = GateOutput
			}
		}
	case s.Gate == GateFirstEvent:
		s.Gate = GateOutput
	case s.Gate == GateHolding:
		if d != nil {
			switch connectors.ClassifyEvent(s.API, d) {
			case connectors.EventPreamble:
			case connectors.EventError:
				s.Gate = GateError
			default:
				s.Gate = GateOutput
			}
		}
	case !s.output && s.Gate == GateOff:
		s.output, s.first = true, true
	}
	if d != nil && connectors.IsDone(d) {
		s.done = true
	}
	return sse.Rewrite(out, ev, s.Rewrite)
}

// FlushPartial appends the final event that lacked its blank line (as
// sse.Reader returns it, blank line added), if any.
func (s *Stream) FlushPartial(out []byte) []byte {
	if len(bytes.TrimSpace(s.partial)) > 0 {
		out = s.emit(out, append(s.partial, "\n\n"...))
	}
	s.partial, s.scanned = nil, 0
	return out
}

// Discard lets go of an event not yet whole, if any: the stream ends
// without it.
func (s *Stream) Discard() { s.partial, s.scanned = nil, 0 }

// TakeFirstOutput reports, once, that an event went out with the gate
// open before any output was recorded (MarkOutput): the stream's first
// output.
func (s *Stream) TakeFirstOutput() bool {
	first := s.first
	s.first = false
	return first
}

// MarkOutput records that the stream's first output is behind it (its
// caller relayed it, or the answer has no events): TakeFirstOutput then
// never reports one.
func (s *Stream) MarkOutput() { s.output, s.first = true, false }

// SawEvents reports whether an event of the stream was fed.
func (s *Stream) SawEvents() bool { return s.events }

// SawDone reports whether the stream's [DONE] came (MarkDone included).
func (s *Stream) SawDone() bool { return s.done }

// MarkDone records a [DONE] seen before the Stream took the answer over
// (by the reader that relayed it so far).
func (s *Stream) MarkDone() { s.done = true }

// Excess reports whether bytes came after the body's end: the connection
// answered something nobody asked, and is not to be reused.
func (s *Stream) Excess() bool { return s.excess }
