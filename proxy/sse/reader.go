package sse

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
)

// Reader splits an SSE body into events (each up to and including its
// blank line), each at most a bound long. A Reader is for one stream and
// one goroutine at a time.
type Reader struct {
	// Refused, when set, is called once, when the stream is refused for an
	// event past the bound (ErrEventTooLong).
	Refused func()
	// Long, when set, is called when the reader begins (or resumes)
	// assembling an event longer than its read buffer, reading the upstream
	// with nothing to return meanwhile (a relay then watches its client,
	// whom no failed write can find gone); the func it returns is called
	// when the assembly stops.
	Long func() (stop func())

	br  *bufio.Reader
	buf []byte // an event assembled across refills, or the final one
	err error  // the read error that ended the stream (sticky)
	// asm: buf holds the start of an event being assembled (assemble was
	// interrupted by a read deadline and resumes); fragment: its last line
	// so far came in more than one piece.
	asm, fragment bool
	// bufs takes br back on Release (nil: not pooled).
	bufs *Bufs
	// ahead, when set, shows bytes received below br that it has not read
	// yet (the upstream connection's buffer), for Pending.
	ahead func() []byte
	// max bounds one event (Bound): the reader stops at the first byte
	// past it and the stream ends with ErrEventTooLong.
	max int
}

// readerSize is the read buffer of one stream. Events are small; a longer
// one is assembled across refills (Next handles ErrBufferFull), so a small
// buffer only costs memory per open stream, not correctness.
const readerSize = 1 << 10

// Lookahead is a stream that shows the bytes received below it that it has
// not returned yet (an upstream leg: its connection's buffer).
type Lookahead interface {
	// Ahead returns those bytes, valid until the stream is read again; it
	// never blocks.
	Ahead() []byte
}

// NewReader reads events of at most maxEvent bytes (0: the default bound)
// from r through a read buffer from bufs (nil: a buffer of its own). When r
// is a Lookahead, Pending looks at its bytes ahead too.
func NewReader(r io.Reader, bufs *Bufs, maxEvent int) *Reader {
	var br *bufio.Reader
	if bufs != nil {
		br, _ = bufs.readers.Get().(*bufio.Reader)
	}
	if br == nil {
		br = bufio.NewReaderSize(r, readerSize)
	} else {
		br.Reset(r)
	}
	e := &Reader{br: br, bufs: bufs, max: Bound(maxEvent)}
	if a, ok := r.(Lookahead); ok {
		e.ahead = a.Ahead
	}
	return e
}

// Release returns the read buffer for reuse; e must not be used after.
func (e *Reader) Release() {
	if e.br != nil && e.bufs != nil {
		e.br.Reset(nil)
		e.bufs.readers.Put(e.br)
	}
	e.br = nil
}

// Pending reports whether a complete event is already buffered, so the
// next call to Next returns without reading the upstream. The relay flushes
// only when nothing complete is pending: events that arrived together leave
// in one write, and an event is never held back waiting for the upstream.
func (e *Reader) Pending() bool {
	b, _ := e.br.Peek(e.br.Buffered())
	if bytes.Contains(b, lfLF) || bytes.Contains(b, crlfCRLF) {
		return true
	}
	if e.ahead == nil {
		return false
	}
	// An event's end inside the connection's unread bytes: the next event
	// has fully arrived (chunk framing does not split "\n\n" apart from its
	// payload), so reading it will not wait on the upstream.
	a := e.ahead()
	return bytes.Contains(a, lfLF) || bytes.Contains(a, crlfCRLF)
}

var (
	lfLF     = []byte("\n\n")
	crlfCRLF = []byte("\r\n\r\n")
)

// Next returns the next event's raw bytes, valid until the following call.
// A final event without its blank line is returned whole (its blank line
// added); io.EOF follows. An event longer than the bound ends the stream:
// ErrEventTooLong, from then on. A read deadline of r passing
// (os.ErrDeadlineExceeded) ends nothing: the next call resumes where this
// one stopped.
func (e *Reader) Next() ([]byte, error) {
	if e.asm {
		return e.assemble()
	}
	if e.err != nil {
		return nil, e.err
	}
	if cap(e.buf) > MaxPooledChunk {
		e.buf = nil // a long event's buffer is not kept for the stream's life
	}
	for {
		ev, tooLong := e.buffered()
		switch {
		case tooLong:
			return nil, e.tooLong()
		case ev != nil:
			return ev, nil
		case e.err != nil:
			return nil, e.err
		}
		// What the buffer holds now is the beginning of one event.
		n := e.br.Buffered()
		if n > e.max {
			return nil, e.tooLong()
		}
		if n >= e.br.Size() {
			return e.assemble() // an event longer than the buffer
		}
		// Wait for more of the event; the buffer keeps what came. A read
		// deadline passing (set by a relay that may hand the stream over)
		// ends no stream.
		if _, err := e.br.Peek(n + 1); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return nil, err
			}
			e.err = err
			rest, _ := e.br.Peek(e.br.Buffered())
			if errors.Is(err, io.EOF) && len(bytes.TrimSpace(rest)) > 0 {
				e.buf = append(append(e.buf[:0], rest...), "\n\n"...)
				_, _ = e.br.Discard(len(rest))
				return e.buf, nil
			}
			return nil, err
		}
	}
}

// assemble reads an event line by line into e.buf, for events that do not
// fit the read buffer. A read deadline passing interrupts it without
// losing anything: the next call resumes.
func (e *Reader) assemble() ([]byte, error) {
	if !e.asm {
		e.buf, e.fragment, e.asm = e.buf[:0], false, true
	}
	if e.Long != nil {
		defer e.Long()()
	}
	for {
		line, err := e.br.ReadSlice('\n')
		e.buf = append(e.buf, line...)
		if len(e.buf) > e.max {
			return nil, e.tooLong()
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			// The line so far came in more than one piece (a line longer than
			// the buffer), so its last piece is no blank line even when it is
			// a lone "\n".
			e.fragment = true
		case errors.Is(err, os.ErrDeadlineExceeded):
			if len(line) > 0 && (len(line) > 1 || line[0] != '\r') {
				// The line goes on after the deadline: what comes next
				// continues it, so a lone "\n" then is its end, no blank
				// line (a lone "\r" cut from its "\n" is one).
				e.fragment = true
			}
			return nil, err
		case err != nil:
			e.asm, e.err = false, err
			if errors.Is(err, io.EOF) && len(bytes.TrimSpace(e.buf)) > 0 {
				e.buf = append(e.buf, "\n\n"...)
				return e.buf, nil
			}
			return nil, err
		case IsBlank(line) && !e.fragment:
			if len(bytes.TrimSpace(e.buf)) > 0 {
				e.asm = false
				return e.buf, nil
			}
			e.buf = e.buf[:0] // a stray blank line between events
		default:
			e.fragment = false
		}
	}
}

// tooLong ends the stream at an event longer than e.max: what was read of
// it is let go, and ErrEventTooLong is returned from now on.
func (e *Reader) tooLong() error {
	e.asm, e.err, e.buf = false, ErrEventTooLong, nil
	if e.Refused != nil {
		e.Refused()
		e.Refused = nil
	}
	return e.err
}

// Unread returns what e holds and has not returned yet: the start of an
// event being assembled, then the read buffer's bytes, for a reader of the
// stream's rest that takes over from e. It is valid until e is used again.
func (e *Reader) Unread() [][]byte {
	b, _ := e.br.Peek(e.br.Buffered())
	if e.asm {
		return [][]byte{e.buf, b}
	}
	return [][]byte{b}
}

// buffered returns the next event without copying it when it is whole in
// the read buffer (skipping blank lines before it), else nil and consumes
// nothing but those blank lines; tooLong reports an event (or blank-only
// run) whole in the buffer but longer than e.max. The slice stays valid
// until the buffer is next filled: up to the following call of Next.
func (e *Reader) buffered() (ev []byte, tooLong bool) {
	b, _ := e.br.Peek(e.br.Buffered())
	start, pos := 0, 0
	for {
		i := bytes.IndexByte(b[pos:], '\n')
		if i < 0 {
			_, _ = e.br.Discard(start)
			return nil, false
		}
		end := pos + i + 1
		if IsBlank(b[pos:end]) {
			switch {
			case end-start > e.max:
				return nil, true
			case len(bytes.TrimSpace(b[start:pos])) == 0:
				start = end // a stray blank line between events
			default:
				_, _ = e.br.Discard(end)
				return b[start:end], false
			}
		}
		pos = end
	}
}
