package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"sync"

	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// eventReader splits an SSE body into events (each up to and including its
// blank line).
type eventReader struct {
	br  *bufio.Reader
	buf []byte // an event assembled across refills, or the final one
	err error  // the read error that ended the stream (sticky)
	// asm: buf holds the start of an event being assembled (assemble was
	// interrupted by a read deadline and resumes); fragment: its last line
	// so far came in more than one piece.
	asm, fragment bool
	// bufs takes br back on release (nil: not pooled).
	bufs *streamBufs
	// ahead, when set, shows bytes received below br that it has not read
	// yet (the upstream connection's buffer), for pending.
	ahead func() []byte
	// max bounds one event (eventbound.go): the reader stops at the first
	// byte past it and the stream ends with ErrEventTooLong; refused, when
	// set, is called then, once.
	max     int
	refused func()
	// long, when set, is called when the reader begins (or resumes)
	// assembling an event longer than its buffer, reading the upstream
	// with nothing to return meanwhile; the func it returns is called when
	// the assembly stops (sseBody.watchClient).
	long func() (stop func())
}

// eventReaderSize is the read buffer of one stream. Events are small; a
// longer one is assembled across refills (next handles ErrBufferFull), so a
// small buffer only costs memory per open stream, not correctness.
const eventReaderSize = 1 << 10

// streamBufs recycles the per-stream buffers of finished streams: event
// readers and chunk buffers; and the buffers of long request bodies and
// of the legs that carry them (upstream.BodyPool). A Proxy owns one; the zero
// value works.
type streamBufs struct {
	readers sync.Pool // *bufio.Reader of eventReaderSize
	chunks  sync.Pool // *[]byte
	bodies  upstream.BodyPool
}

// getChunk returns an empty chunk buffer (4 KiB or more) and its pool
// entry, for putChunk.
func (b *streamBufs) getChunk() (*[]byte, []byte) {
	p, _ := b.chunks.Get().(*[]byte)
	if p == nil {
		buf := make([]byte, 0, 4<<10)
		p = &buf
	}
	return p, (*p)[:0]
}

// putChunk gives back a chunk buffer taken with getChunk; buf is the buffer
// as grown since: one grown past maxPooledChunk by growChunk goes back to
// its body size class, one grown otherwise is dropped.
func (b *streamBufs) putChunk(p *[]byte, buf []byte) {
	switch {
	case p == nil:
	case cap(buf) <= maxPooledChunk:
		*p = buf[:0]
		b.chunks.Put(p)
	default:
		*p = buf
		b.bodies.Put(p)
	}
}

// editScratch returns a buffer for an edited copy of a body of n bytes
// that a leg copies at once (legTo): from the body pool for a long body
// (give it back with putScratch), else none (the edit allocates its own).
func (b *streamBufs) editScratch(n int) (*[]byte, []byte) {
	if n <= maxPooledChunk {
		return nil, nil
	}
	p := b.bodies.Get(n + editRoom)
	return p, *p
}

// editRoom is what a leg's edits add to a body, as a rule (a
// kv_transfer_params with a long prompt's block ids): a larger edit grows
// the buffer itself.
const editRoom = 16 << 10

// putScratch gives back a buffer of editScratch.
func (b *streamBufs) putScratch(p *[]byte) {
	if p != nil {
		b.bodies.Put(p)
	}
}

// growChunk makes room for n more bytes in buf, a chunk buffer (entry p):
// a chunk that would grow past maxPooledChunk (a leg carrying a long body)
// moves to a buffer of the body pool with room for all, its bytes copied
// once, instead of doubling by append.
func (b *streamBufs) growChunk(p *[]byte, buf []byte, n int) (*[]byte, []byte) {
	if cap(buf)-len(buf) >= n || len(buf)+n <= maxPooledChunk {
		return p, buf
	}
	np := b.bodies.Get(len(buf) + n)
	nb := append(*np, buf...)
	b.putChunk(p, buf)
	return np, nb
}

// newEventReader reads events of at most maxEvent bytes (0: the default
// bound) from r through a buffer from bufs (nil: a buffer of its own).
func newEventReader(r io.Reader, bufs *streamBufs, maxEvent int) *eventReader {
	var br *bufio.Reader
	if bufs != nil {
		br, _ = bufs.readers.Get().(*bufio.Reader)
	}
	if br == nil {
		br = bufio.NewReaderSize(r, eventReaderSize)
	} else {
		br.Reset(r)
	}
	e := &eventReader{br: br, bufs: bufs, max: eventBound(maxEvent)}
	if l, ok := r.(*upstream.Leg); ok {
		e.ahead = l.Ahead
	}
	return e
}

// release returns the read buffer for reuse; e must not be used after.
func (e *eventReader) release() {
	if e.br != nil && e.bufs != nil {
		e.br.Reset(nil)
		e.bufs.readers.Put(e.br)
	}
	e.br = nil
}

// pending reports whether a complete event is already buffered, so the
// next call to next returns without reading the upstream. The relay flushes
// only when nothing complete is pending: events that arrived together leave
// in one write, and an event is never held back waiting for the upstream.
func (e *eventReader) pending() bool {
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

// next returns the next event's raw bytes, valid until the following call.
// A final event without its blank line is returned whole; io.EOF follows.
// An event longer than e.max ends the stream: ErrEventTooLong, from then
// on.
func (e *eventReader) next() ([]byte, error) {
	if e.asm {
		return e.assemble()
	}
	if e.err != nil {
		return nil, e.err
	}
	if cap(e.buf) > maxPooledChunk {
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
		// deadline passing (an sseBody's, see firstWritten) ends no stream.
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
func (e *eventReader) assemble() ([]byte, error) {
	if !e.asm {
		e.buf, e.fragment, e.asm = e.buf[:0], false, true
	}
	if e.long != nil {
		defer e.long()()
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
		case isBlank(line) && !e.fragment:
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
func (e *eventReader) tooLong() error {
	e.asm, e.err, e.buf = false, ErrEventTooLong, nil
	if e.refused != nil {
		e.refused()
		e.refused = nil
	}
	return e.err
}

// unread returns what e holds and has not returned yet: the start of an
// event being assembled, then the read buffer's bytes. It is valid until e
// is used again.
func (e *eventReader) unread() [][]byte {
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
// until the buffer is next filled: up to the following call of next.
func (e *eventReader) buffered() (ev []byte, tooLong bool) {
	b, _ := e.br.Peek(e.br.Buffered())
	start, pos := 0, 0
	for {
		i := bytes.IndexByte(b[pos:], '\n')
		if i < 0 {
			_, _ = e.br.Discard(start)
			return nil, false
		}
		end := pos + i + 1
		if isBlank(b[pos:end]) {
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

func isBlank(line []byte) bool {
	return len(line) == 1 || (len(line) == 2 && line[0] == '\r')
}

var dataPrefix = []byte("data:")

// firstData returns the payload of the event's first data line (nil when
// it has none, e.g. a comment).
func firstData(ev []byte) []byte {
	for len(ev) > 0 {
		line := ev
		if i := bytes.IndexByte(ev, '\n'); i >= 0 {
			line, ev = ev[:i], ev[i+1:]
		} else {
			ev = nil
		}
		if bytes.HasPrefix(line, dataPrefix) {
			return bytes.TrimSpace(line[len(dataPrefix):])
		}
	}
	return nil
}

// rewriteEvent appends ev to dst with fn applied to each data payload.
func rewriteEvent(dst, ev []byte, fn func([]byte) []byte) []byte {
	if fn == nil {
		return append(dst, ev...)
	}
	for len(ev) > 0 {
		line := ev
		if i := bytes.IndexByte(ev, '\n'); i >= 0 {
			line, ev = ev[:i+1], ev[i+1:]
		} else {
			ev = nil
		}
		if !bytes.HasPrefix(line, dataPrefix) {
			dst = append(dst, line...)
			continue
		}
		payload := bytes.TrimSpace(line[len(dataPrefix):])
		dst = append(dst, "data: "...)
		dst = append(dst, fn(payload)...)
		dst = append(dst, '\n')
	}
	return dst
}

// sseError is the event that ends a stream the upstream broke off.
func sseError(status int, err error) []byte {
	b := append([]byte("data: "), errorBody(status, err)...)
	return append(b, "\n\ndata: [DONE]\n\n"...)
}
