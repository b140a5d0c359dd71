package upstream

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/pd-sidecar/pd-sidecar/httpbody"
)

// Leg is the streamed body of one upstream response. It is read and closed
// by one goroutine (Close must not race a Read); cancelling its context from
// any goroutine interrupts a pending Read.
type Leg struct {
	addr       string // the upstream's host:port
	ctx        context.Context
	br         *bufio.Reader // the connection's reader
	conn       net.Conn
	body       httpbody.Decoder
	declared   int                 // the answer's Content-Length (negative: none)
	putReader  func(*bufio.Reader) // gives br back to its pool
	release    func(clean bool)    // gives the connection back, or closes it
	stopCancel func() bool         // disarms the context's close-the-connection hook
	eof        bool
	closed     bool
	budget     BufferBudget // what a body read whole draws from (nil: unbounded)

	// firstByte, while not zero, is the first-byte timeout still bounding
	// reads (StreamFirstByteTimeout), until Began restores deadline.
	firstByte time.Duration
	deadline  time.Time
}

// Began ends the first-byte bound of the leg: the answer began.
func (l *Leg) Began() {
	if l.firstByte == 0 || l.closed {
		return
	}
	l.firstByte = 0
	_ = l.conn.SetDeadline(l.deadline) // a failure fails the next read
}

// Conn returns the connection the body is read from, for what the leg's
// reader does to it beside reading: a read deadline, its descriptor for an
// event loop. Reading from it bypasses the leg; only a reader that took
// the connection over (see Disarm) may.
func (l *Leg) Conn() net.Conn { return l.conn }

// Body returns the decoder of the body's framing in the state the reads so
// far left it: a reader that takes the connection over (Disarm, Ahead,
// DropReader) decodes the rest of the body with it.
func (l *Leg) Body() httpbody.Decoder { return l.body }

// Ahead returns the raw bytes already received on the connection and not
// yet read through the body (chunk framing included). It never blocks.
func (l *Leg) Ahead() []byte {
	if l.closed || l.br == nil {
		return nil
	}
	b, _ := l.br.Peek(l.br.Buffered())
	return b
}

// Read reads the response body.
func (l *Leg) Read(p []byte) (int, error) {
	if l.closed {
		return 0, io.ErrClosedPipe
	}
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if l.eof {
			return 0, io.EOF
		}
		if l.br.Buffered() == 0 {
			if _, err := l.br.Peek(1); err != nil {
				if errors.Is(err, io.EOF) {
					if l.body.Mode() == httpbody.UntilClose {
						l.eof = true
						return 0, io.EOF
					}
					err = io.ErrUnexpectedEOF
				}
				if l.firstByte > 0 && l.ctx.Err() == nil && IsTimeout(err) {
					err = fmt.Errorf("%w after %v: %w", ErrFirstByteTimeout, l.firstByte, err)
				}
				return 0, CtxErr(l.ctx, err)
			}
		}
		in, _ := l.br.Peek(l.br.Buffered())
		data, n, err := l.body.Next(in, len(p))
		copy(p, data)
		_, _ = l.br.Discard(n)
		l.eof = l.body.Done()
		if err != nil {
			return 0, BadAnswer("malformed answer body", err)
		}
		if len(data) > 0 {
			return len(data), nil
		}
	}
}

// ReadAll reads the whole body, refusing one longer than maxBody bytes
// (ErrAnswerTooLarge) before reading it when its length is declared, as it
// grows otherwise. The buffer holding it is reserved from the leg's budget
// before it is allocated (see AnswerHold; refused: ErrBufferBudget), and
// the caller releases the hold once it lets go of the bytes. On failure
// nothing is held.
func (l *Leg) ReadAll(maxBody int64) (b []byte, hold AnswerHold, err error) {
	defer func() {
		if err != nil {
			err = &LegError{Addr: l.addr, Op: "read", Err: err}
		}
	}()
	hold.b = l.budget
	size := int64(512) // the buffer's first size, as io.ReadAll's
	if !l.eof && l.body.Mode() == httpbody.Length {
		if int64(l.declared) > maxBody {
			return nil, AnswerHold{}, fmt.Errorf("%w (Content-Length %d)", ErrAnswerTooLarge, l.declared)
		}
		size = int64(l.declared)
		if err := hold.Cover(size, size); err != nil {
			return nil, AnswerHold{}, err
		}
	}
	// A body of maxBody bytes, and a byte more that shows it too long.
	limit := maxBody + 1
	b = make([]byte, 0, min(size, limit))
	for {
		if l.eof {
			return b, hold, nil // a declared length's end, past which nothing is read
		}
		if len(b) == cap(b) {
			if int64(len(b)) >= limit {
				hold.Release()
				return nil, AnswerHold{}, ErrAnswerTooLarge
			}
			grown := min(max(2*int64(cap(b)), 512), limit)
			if err := hold.Cover(grown, limit); err != nil {
				hold.Release()
				return nil, AnswerHold{}, err
			}
			b = append(make([]byte, 0, grown), b...)
		}
		n, err := l.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if errors.Is(err, io.EOF) {
			if int64(len(b)) > maxBody {
				hold.Release()
				return nil, AnswerHold{}, ErrAnswerTooLarge
			}
			return b, hold, nil
		}
		if err != nil {
			hold.Release()
			return nil, AnswerHold{}, err
		}
	}
}

// Close ends the leg. The connection goes back to the pool only when the
// body was read to its end; otherwise it is closed, so the engine sees the
// request abandoned.
func (l *Leg) Close() {
	if l.closed {
		return
	}
	l.closed = true
	// Bytes after the body are no answer to anything sent: the connection
	// is not pooled.
	clean := l.eof && l.body.Mode() != httpbody.UntilClose && (l.br == nil || l.br.Buffered() == 0)
	l.DropReader()
	l.release(clean)
}

// Disarm makes sure nothing but Close will close the connection: it stops
// the hook that closes it when the leg's context ends, and reports whether
// that hook had not run (when it had, the connection is closed or
// closing). A reader that takes the connection over (an event loop) calls
// it first, and then owns the leg's cancellation.
func (l *Leg) Disarm() bool { return l.stopCancel() }

// DropReader gives the connection's read buffer back; the bytes it held
// must have been taken (Ahead) before. The leg is then read no more
// through Read or ReadAll: the connection is the caller's to read.
func (l *Leg) DropReader() {
	if l.br != nil {
		l.putReader(l.br)
		l.br = nil
	}
}

// MarkEnded records, for a reader that took the connection over (Disarm,
// DropReader), whether it read the body to its end and nothing past it
// (clean); Close then gives the connection back to its pool only if so.
func (l *Leg) MarkEnded(clean bool) { l.eof = clean }
