package rawhttp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/httpbody"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// ParseAnswerHead parses the head of an upstream answer at the front of b
// into h (through rd and br, the caller's parser buffers, br maxHead bytes
// long), exactly as the fasthttp path's upstream.ReadAnswer does from the
// same bytes: an interim 100 Continue is skipped (up to
// upstream.MaxInterim, counted in *interim), any other status below 200 is
// refused, and so is a head longer than maxHead or one that does not
// parse, as soon as what came shows it (all upstream.ErrBadUpstreamAnswer).
// whole reports an answer's head found: rest is then what follows it;
// otherwise rest is what is left of b once interim answers are skipped, to
// be read on with more bytes.
func ParseAnswerHead(h *fasthttp.ResponseHeader, rd *bytes.Reader, br *bufio.Reader, b []byte, maxHead int, interim *int) (rest []byte, whole bool, err error) {
	for {
		h.Reset()
		rd.Reset(b)
		br.Reset(rd)
		if err := h.Read(br); err != nil {
			if !errors.Is(err, io.EOF) {
				return nil, false, upstream.AnswerHeadErr(err)
			}
			if len(b) >= maxHead {
				return nil, false, upstream.BadAnswer("answer head longer than the read buffer", nil)
			}
			return b, false, nil // not whole yet
		}
		b = b[len(b)-rd.Len()-br.Buffered():]
		st := h.StatusCode()
		if st >= 200 {
			return b, true, nil
		}
		if st != fasthttp.StatusContinue || *interim >= upstream.MaxInterim {
			return nil, false, upstream.BadAnswer(fmt.Sprintf("status %d", st), nil)
		}
		*interim++
	}
}

// Answer is a non-streamed answer, read whole before it is written: its
// head, and its body as it comes in reads (Feed).
type Answer struct {
	Head   fasthttp.ResponseHeader
	Body   httpbody.Decoder
	Status int
	Buf    []byte // the body, decoded
	Max    int64  // --max-upstream-answer-bytes
	Excess bool   // bytes came after the body: the connection is not pooled
	// Hold is Buf's share of --max-buffered-bytes, reserved before bytes
	// are kept (as upstream.ReadAnswer does); the owner releases it once
	// the answer is written or dropped.
	Hold upstream.AnswerHold
}

// Begin refuses an answer whose head h declares a body longer than a.Max,
// or one the buffer budget has no room for, before any of it is read.
func (a *Answer) Begin(h *fasthttp.ResponseHeader) error {
	if cl := h.ContentLength(); !a.Body.Done() && cl > 0 {
		if int64(cl) > a.Max {
			return fmt.Errorf("%w (Content-Length %d)", upstream.ErrAnswerTooLarge, cl)
		}
		return a.Hold.Cover(int64(cl), int64(cl))
	}
	return nil
}

// Feed decodes body bytes b (framing included), refusing a body longer
// than a.Max, or one the buffer budget has no room for, before it is kept;
// bytes after the body's end mark it Excess.
func (a *Answer) Feed(b []byte) error {
	for len(b) > 0 && !a.Body.Done() {
		data, n, err := a.Body.Next(b, len(b))
		if err != nil {
			return upstream.BadAnswer("malformed answer body", err)
		}
		size := int64(len(a.Buf) + len(data))
		if size > a.Max {
			return upstream.ErrAnswerTooLarge
		}
		if err := a.Hold.Cover(size, a.Max); err != nil {
			return err
		}
		a.Buf = append(a.Buf, data...)
		b = b[n:]
	}
	if len(b) > 0 {
		a.Excess = true
	}
	return nil
}
