package chunked

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/rs/zerolog"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// Op is what a chunked decode's machine asks its driver to do.
type Op int

const (
	// SendChunk: send Body to the local engine (Handoff: it carries the
	// split's KV handoff) and feed the machine its answer (Answered) or
	// why it got none (Failed).
	SendChunk Op = iota + 1
	// AnswerWhole: answer Status with ContentType and Body (an event
	// stream whole is answered no-cache); the decode is over.
	AnswerWhole
	// BeginStream: answer Status with a no-cache event stream of
	// ContentType whose first bytes are Body (the first chunk's text); once they are on their way,
	// ask for more (Written). A client that has just left, so that nothing
	// could be answered: StreamRefused.
	BeginStream
	// WriteEvents: write Body to the stream; once it is on its way, ask
	// for more (Written).
	WriteEvents
	// EndStream: the stream's last bytes were the last WriteEvents; close
	// it once they are written, and report whether they were (Closed).
	EndStream
	// AbortStream: the client left mid-stream; stop writing and close the
	// stream (Closed, false).
	AbortStream
	// Return: the decode failed before the client saw anything; the
	// request answers Err (Deps.KVLoadFailed: it falls back to a local
	// prefill; Deps.ClientGone: nobody waits). The decode is over.
	Return
)

// Action is one thing the machine asks of its driver.
type Action struct {
	Op          Op
	Body        []byte
	Handoff     bool
	Status      int
	ContentType string
	Err         error
}

// Recorder is what the machine reads of its request and tells it: no
// I/O but the request's log.
type Recorder interface {
	// Gone reports whether the client left.
	Gone() bool
	// Left records a client that left mid-stream.
	Left()
	// Report puts the decode's chunk count in the request's report.
	Report(chunks int)
	// Log is the request's log at a level (nil when that level is off).
	Log(l zerolog.Level) *zerolog.Event
}

// Machine is one chunked decode's decisions, without I/O: which chunk to
// send, what to answer, when the stream begins and ends, how each outcome
// is counted and logged. Its drivers (Run on a goroutine, the lane on an
// event loop) do the I/O and feed it what happened. Each decode is
// counted once, by outcome (metrics.Chunked*); a stream's outcome once
// it is closed.
type Machine struct {
	d         Deps
	rec       Recorder
	j         Job
	dec       *Decode
	streaming bool   // the stream began: the client has seen its head
	outcome   string // a stream's outcome, once its last bytes are out
	over      bool   // counted and logged
}

// NewMachine returns the machine of a chunked decode for rec.
func NewMachine(d Deps, rec Recorder, j Job) *Machine {
	return &Machine{d: d, rec: rec, j: j, dec: NewDecode(j.Plan, j.Body)}
}

// Chunks is the number of chunks sent.
func (m *Machine) Chunks() int { return m.dec.Chunks() }

// Start begins the decode: its first chunk.
func (m *Machine) Start() []Action {
	m.j.Inflight.Inc()
	return m.next()
}

// next sends the next chunk.
func (m *Machine) next() []Action {
	first := m.dec.Chunks() == 0
	body, err := m.dec.Next()
	if err != nil {
		return m.Failed(fmt.Errorf("%w: %w", m.d.BadRequest, err))
	}
	m.d.Metrics.Chunks.Inc()
	return []Action{{Op: SendChunk, Body: body, Handoff: m.j.Remote && first}}
}

// Answered takes the engine's answer to the chunk sent last.
func (m *Machine) Answered(a Answer) []Action {
	if m.over {
		return nil
	}
	if a.Status != http.StatusOK {
		return m.Failed(&Failed{Status: a.Status, ContentType: a.ContentType, Body: a.Body, cause: m.d.DecodeFailed})
	}
	if err := m.dec.Add(a.Body); err != nil {
		return m.Failed(err)
	}
	switch {
	case m.streaming && m.rec.Gone():
		m.outcome = metrics.ChunkedClientLeft
		return []Action{{Op: AbortStream, Err: m.d.ClientGone}}
	case m.streaming:
		buf := m.dec.TextEvent(nil)
		if !m.dec.Ended() {
			return []Action{{Op: WriteEvents, Body: buf}}
		}
		m.outcome = metrics.ChunkedCompleted
		return []Action{{Op: WriteEvents, Body: m.dec.CloseEvents(buf, m.j.Usage)}, {Op: EndStream}}
	case m.dec.Ended():
		m.end(metrics.ChunkedCompleted)
		if m.j.Stream {
			return []Action{{Op: AnswerWhole, Status: http.StatusOK, ContentType: "text/event-stream",
				Body: m.dec.CloseEvents(m.dec.OpenEvent(nil), m.j.Usage)}}
		}
		body := m.dec.JSON()
		if m.j.Edit != nil {
			body = m.j.Edit(body)
		}
		return []Action{{Op: AnswerWhole, Status: http.StatusOK, ContentType: "application/json", Body: body}}
	case m.j.Stream:
		// The stream carries the first chunk's text now and each further
		// chunk's as it comes.
		m.streaming = true
		return []Action{{Op: BeginStream, Status: http.StatusOK, ContentType: "text/event-stream", Body: m.dec.OpenEvent(nil)}}
	}
	return m.next()
}

// Written: the stream's last bytes are on their way; the next chunk is
// sent.
func (m *Machine) Written() []Action {
	if m.over || !m.streaming || m.outcome != "" {
		return nil
	}
	return m.next()
}

// StreamRefused: the stream could not begin, the client having just
// left; nothing reached it.
func (m *Machine) StreamRefused() []Action {
	m.streaming = false
	return m.Failed(m.d.ClientGone)
}

// Failed takes a chunk that got no answer (a transport failure, the
// remote KV that could not be loaded, the client gone) or could not be
// used.
func (m *Machine) Failed(err error) []Action {
	if m.over || m.outcome != "" {
		return nil
	}
	gone := m.rec.Gone() || errors.Is(err, m.d.ClientGone)
	if m.streaming {
		if gone {
			m.outcome = metrics.ChunkedClientLeft
			return []Action{{Op: AbortStream, Err: m.d.ClientGone}}
		}
		m.outcome = metrics.ChunkedFailed
		if ev := m.rec.Log(zerolog.ErrorLevel); ev != nil {
			ev.Err(err).Int("chunk", m.dec.Chunks()).Msg("decode chunk failed mid-stream; the stream ends with an error event")
		}
		buf := append([]byte("data: "), m.errorBody(err)...)
		buf = append(buf, "\n\ndata: [DONE]\n\n"...)
		return []Action{{Op: WriteEvents, Body: buf}, {Op: EndStream}}
	}
	var cf *Failed
	switch {
	case errors.Is(err, m.d.KVLoadFailed):
		m.end(metrics.ChunkedFallback)
	case gone:
		m.end(metrics.ChunkedClientLeft)
	case errors.As(err, &cf):
		m.end(metrics.ChunkedFailed)
		if ev := m.rec.Log(zerolog.ErrorLevel); ev != nil {
			ev.Int("chunk", m.dec.Chunks()).Int("status", cf.Status).Msg("decode chunk failed; the engine's error passed on")
		}
		b := cf.Body
		if !connectors.IsObject(b) {
			b = m.d.ErrorBody(err)
		}
		return []Action{{Op: AnswerWhole, Status: cf.Status, ContentType: "application/json", Body: b}}
	default:
		m.end(metrics.ChunkedFailed)
	}
	return []Action{{Op: Return, Err: err}}
}

// Closed: the stream is closed; written says whether its last bytes
// reached the client. One that did not is a client that left.
func (m *Machine) Closed(written bool) {
	if m.over {
		return
	}
	if !written || m.outcome == "" {
		m.outcome = metrics.ChunkedClientLeft
	}
	if m.outcome == metrics.ChunkedClientLeft {
		m.rec.Left()
	}
	m.end(m.outcome)
}

// Abandon: the request ended while the decode ran (the client left
// before its answer began, or the sidecar stopped it); counted as a
// client that left, and one that left mid-stream recorded.
func (m *Machine) Abandon() {
	if m.streaming {
		m.Closed(false)
		return
	}
	m.end(metrics.ChunkedClientLeft)
}

// Over reports whether the decode ended (counted and logged).
func (m *Machine) Over() bool { return m.over }

// end counts and logs the decode's outcome, once.
func (m *Machine) end(outcome string) {
	if m.over {
		return
	}
	m.over = true
	m.j.Inflight.Dec()
	m.d.Metrics.Decodes.WithLabelValues(outcome).Inc()
	m.rec.Report(m.dec.Chunks())
	if ev := m.rec.Log(zerolog.InfoLevel); ev != nil {
		ev.Str("outcome", outcome).Int("chunks", m.dec.Chunks()).Int("completion_tokens", m.dec.Tokens()).
			Str("finish_reason", m.dec.Finish()).Msg("chunked decode")
	}
}
