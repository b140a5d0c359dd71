package upstream

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/httpbody"
)

// DefaultMaxUpstreamAnswerBytes is --max-upstream-answer-bytes' default: a
// prefill answer is small JSON, a non-streamed decode answer with logprobs
// a few MiB.
const DefaultMaxUpstreamAnswerBytes = 8 << 20

// defaultAnswerHeadBytes bounds an answer's head when no --max-header-bytes
// is set (as the guard's default).
const defaultAnswerHeadBytes = 8 << 10

// SetAnswerLimits sets the largest answer read whole (maxAnswer) and the
// largest answer head (headBytes), for connections acquired from now on.
func (t *Transport) SetAnswerLimits(maxAnswer int64, headBytes int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.maxAnswer, t.headBytes = maxAnswer, headBytes
}

// BufferBudget is the bound of the bytes buffered at once by all requests
// together (--max-buffered-bytes; *Budget implements it), as answers read
// whole draw from it.
type BufferBudget interface {
	// TryReserve reserves n bytes, or reports that they do not fit.
	TryReserve(n int64) bool
	// Release gives back n bytes reserved.
	Release(n int64)
}

// SetAnswerBudget makes answers read whole (Do, and a Leg's body read
// whole) draw from b, for exchanges begun from now on; nil: unbounded.
func (t *Transport) SetAnswerBudget(b BufferBudget) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.budget = b
}

// AnswerHold is the share of the buffer budget an answer read whole holds:
// its body's length (past UnreservedBody, which like a request body's is
// part of a connection's fixed cost), reserved before the bytes are kept:
// a declared Content-Length up front, a chunked or close-delimited body in
// steps as it grows (doubling, at least AnswerStep, never past the
// per-answer bound). The holder gives it back with Release once it lets go
// of the answer's bytes (and of any copy of them it kept). The zero
// AnswerHold holds nothing.
type AnswerHold struct {
	b BufferBudget
	n int64 // bytes reserved
}

// NewAnswerHold returns an empty hold that reserves from b (nil:
// unbounded), for a reader of a whole answer other than this package's
// (Cover).
func NewAnswerHold(b BufferBudget) AnswerHold { return AnswerHold{b: b} }

// AnswerStep is the smallest step in which a growing answer is reserved.
const AnswerStep = 64 << 10

// Release gives the reservation back; a second call does nothing.
func (h *AnswerHold) Release() {
	if h.b != nil && h.n > 0 {
		h.b.Release(h.n)
	}
	h.n = 0
}

// Take moves the reservation into a new hold, which the caller releases
// instead of h.
func (h *AnswerHold) Take() AnswerHold {
	t := *h
	h.n = 0
	return t
}

// Add moves o's reservation into h, which the caller then releases
// instead of o. Both draw from the same budget; an h that holds none
// takes o's.
func (h *AnswerHold) Add(o AnswerHold) {
	if h.b == nil {
		*h = o
		return
	}
	h.n += o.n
}

// Cover makes the hold cover size bytes of a body of at most maxBody
// bytes, or fails with ErrBufferBudget (nothing more is then reserved). A
// reader calls it before it keeps the bytes: with a declared length, once
// with size and maxBody both that length; as a body of unknown length
// grows, with its size so far and the per-answer bound.
func (h *AnswerHold) Cover(size, maxBody int64) error {
	if h.b == nil || size <= h.n || size <= UnreservedBody {
		return nil
	}
	want := max(size, 2*h.n, AnswerStep)
	want = max(min(want, maxBody), size)
	if !h.b.TryReserve(want - h.n) {
		return fmt.Errorf("%w (--max-buffered-bytes): an upstream answer of %d bytes or more", ErrBufferBudget, size)
	}
	h.n = want
	return nil
}

// ErrBadUpstreamAnswer: an upstream's answer is not one the sidecar takes:
// a status below 200 other than an interim 100 Continue, a malformed head
// or body, or a body past --max-upstream-answer-bytes. From a prefiller it
// is a failed prefill (bad_answer); from the local engine, a 502.
var ErrBadUpstreamAnswer = errors.New("unacceptable upstream answer")

// ErrAnswerTooLarge: an answer read whole is longer than
// --max-upstream-answer-bytes.
var ErrAnswerTooLarge = BadAnswer("longer than --max-upstream-answer-bytes", nil)

// MaxInterim bounds the interim 100 Continue answers skipped before an
// answer.
const MaxInterim = 4

// ReadAnswer reads resp from br, as Transport.Do and Stream read an
// answer: whole, its body at most maxBody bytes and reserved in hold (nil:
// unbounded), or only its head when stream is set. An interim 100 Continue is skipped; any
// other status below 200 is refused (ErrBadUpstreamAnswer), as is a
// malformed head or body: a 101 is no switch the sidecar asked for, and a
// body after it would be relayed as whatever it says it is.
func ReadAnswer(br *bufio.Reader, resp *fasthttp.Response, stream bool, maxBody int64, hold *AnswerHold) error {
	for interim := 0; ; interim++ {
		if err := resp.Header.Read(br); err != nil {
			return AnswerHeadErr(err)
		}
		st := resp.StatusCode()
		if st >= 200 {
			break
		}
		if st != fasthttp.StatusContinue || interim >= MaxInterim {
			return BadAnswer(fmt.Sprintf("status %d", st), nil)
		}
		resp.Header.Reset()
	}
	if stream {
		return nil
	}
	return readAnswerBody(br, resp, maxBody, hold)
}

// AnswerHeadErr names err, a failed read of an answer's head by
// fasthttp's parser: the connection's failure (closed, reset, timed out)
// in fixed words, its cause kept for errors.Is and errors.As; anything
// else (a head that does not parse, or is longer than the read buffer) as
// a bad answer (ErrBadUpstreamAnswer).
func AnswerHeadErr(err error) error {
	var ne net.Error
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, fasthttp.ErrTimeout) ||
		errors.As(err, &ne) || IsReset(err):
		// The failure stays matchable (errors.Is/As), but fasthttp's
		// message quotes what the head had so far: said in fixed words.
		return &headReadError{err: err}
	case errors.As(err, &small):
		return BadAnswer("answer head longer than the read buffer", err)
	}
	// fasthttp's message quotes the head: never said.
	return BadAnswer("malformed answer head", err)
}

// headReadError is a connection's failure while an answer's head was
// read: its cause kept for errors.Is/As, its message in fixed words
// (ReasonOf), never the bytes the head had so far.
type headReadError struct{ err error }

func (e *headReadError) Error() string { return "reading the answer head: " + ReasonOf(e.err) }
func (e *headReadError) Unwrap() error { return e.err }

// readAnswerBody reads resp's body whole from br, decoded as the event
// loops and a Leg decode it (httpbody), and refuses it past maxBody bytes before
// reading them: a declared length up front, a chunked or close-delimited
// body as it grows. The body's bytes are reserved in hold (nil:
// unbounded) before they are kept (see AnswerHold); a body the budget
// refuses fails with ErrBufferBudget, and what hold reserved stays there
// for the caller to release. A body delimited by the connection's close
// marks resp Connection: close (the connection is not pooled).
func readAnswerBody(br *bufio.Reader, resp *fasthttp.Response, maxBody int64, hold *AnswerHold) error {
	resp.ResetBody()
	if hold == nil {
		hold = &AnswerHold{}
	}
	dec := bodyDecoder(resp)
	if cl := resp.Header.ContentLength(); !dec.Done() && cl > 0 {
		if int64(cl) > maxBody {
			return fmt.Errorf("%w (Content-Length %d)", ErrAnswerTooLarge, cl)
		}
		if err := hold.Cover(int64(cl), int64(cl)); err != nil {
			return err
		}
	}
	for !dec.Done() {
		if br.Buffered() == 0 {
			if _, err := br.Peek(1); err != nil {
				if errors.Is(err, io.EOF) {
					if dec.Mode() == httpbody.UntilClose {
						resp.SetConnectionClose()
						return nil
					}
					err = io.ErrUnexpectedEOF
				}
				return err
			}
		}
		in, _ := br.Peek(br.Buffered())
		data, n, err := dec.Next(in, len(in))
		if err != nil {
			return BadAnswer("malformed answer body", err)
		}
		size := int64(len(resp.Body()) + len(data))
		if size > maxBody {
			return ErrAnswerTooLarge
		}
		if err := hold.Cover(size, maxBody); err != nil {
			return err
		}
		resp.AppendBody(data)
		_, _ = br.Discard(n)
	}
	return nil
}

// bodyDecoder returns the framing decoder of resp's body.
func bodyDecoder(resp *fasthttp.Response) httpbody.Decoder {
	if resp.SkipBody {
		return httpbody.New(httpbody.Length, 0)
	}
	return HeadDecoder(&resp.Header)
}

// Bodiless reports whether an answer of status st has no body, whatever
// its head says (a 1xx never reaches a client: ReadAnswer refuses it).
func Bodiless(st int) bool {
	return st < 200 || st == fasthttp.StatusNoContent || st == fasthttp.StatusNotModified
}

// HeadDecoder returns the framing decoder of the body of the answer with
// head h.
func HeadDecoder(h *fasthttp.ResponseHeader) httpbody.Decoder {
	if Bodiless(h.StatusCode()) {
		return httpbody.New(httpbody.Length, 0)
	}
	switch cl := h.ContentLength(); {
	case cl >= 0:
		return httpbody.New(httpbody.Length, int64(cl))
	case cl == -1:
		return httpbody.New(httpbody.Chunked, 0)
	default:
		return httpbody.New(httpbody.UntilClose, 0)
	}
}
