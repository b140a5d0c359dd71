package guard

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// BodyHolds wires the budget into fasthttp's reading of request bodies.
// fasthttp reads a body whole before the handler runs, and calls
// Server.HeaderReceived in between, when the head is read; so the body is
// reserved there, by its declared Content-Length (a chunked body, whose
// size is unknown until read, reserves --max-request-body-bytes, trimmed
// to its size once read). A body that does not fit is refused before a
// byte of it is read: HeaderReceived caps that request's body size, so
// fasthttp fails it at once with ErrBodyTooLarge, and the error handler,
// told by the hold, answers 503 instead of 413.
//
// HeaderReceived is told only the request's header, which lives in the
// connection's RequestCtx; the hold is kept by that header's address until
// the handler claims it (and releases it when it returns) or the error
// handler does. fasthttp gives up on a few reads without calling either (a
// connection closed mid-body on some paths); such a hold is released when
// the same RequestCtx reads its next head, or, when the budget runs short,
// once it is older than --read-timeout, by which time fasthttp has either
// read the body or failed it.
type BodyHolds struct {
	b       *upstream.Budget
	maxBody int64
	stale   time.Duration

	mu   sync.Mutex
	held map[*fasthttp.RequestHeader]bodyHold
	// holds is len(held), read without mu: a request with a small body
	// and no hold (nearly every one) takes no lock.
	holds atomic.Int64
}

type bodyHold struct {
	n       int64 // bytes reserved
	at      time.Time
	refused bool // the body did not fit: answered 503
}

// newBodyHolds returns the holds on b of request bodies of at most maxBody
// bytes, read within readTimeout.
func newBodyHolds(b *upstream.Budget, maxBody int, readTimeout time.Duration) *BodyHolds {
	return &BodyHolds{b: b, maxBody: int64(maxBody), stale: readTimeout + time.Second,
		held: map[*fasthttp.RequestHeader]bodyHold{}}
}

// HeaderReceived implements fasthttp.Server.HeaderReceived.
func (h *BodyHolds) HeaderReceived(hdr *fasthttp.RequestHeader) fasthttp.RequestConfig {
	n := int64(hdr.ContentLength())
	if n == -1 { // chunked
		n = h.maxBody
	}
	// A small body, none, or one fasthttp refuses itself (413) is not
	// reserved.
	reserve := n > upstream.UnreservedBody && n <= h.maxBody
	if !reserve && h.holds.Load() == 0 {
		return fasthttp.RequestConfig{}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if old, ok := h.held[hdr]; ok {
		// The same context reads its next request: the last one's body
		// was never claimed.
		h.drop(hdr)
		h.b.Release(old.n)
	}
	if !reserve {
		return fasthttp.RequestConfig{}
	}
	if !h.b.TryReserve(n) && (h.reclaim() == 0 || !h.b.TryReserve(n)) {
		h.put(hdr, bodyHold{refused: true})
		// The smallest bound fasthttp takes: it fails the body at once.
		return fasthttp.RequestConfig{MaxRequestBodySize: 1}
	}
	h.put(hdr, bodyHold{n: n, at: time.Now()})
	return fasthttp.RequestConfig{}
}

// put and drop add and remove a hold; h.mu is held.
func (h *BodyHolds) put(hdr *fasthttp.RequestHeader, v bodyHold) {
	if _, ok := h.held[hdr]; !ok {
		h.holds.Add(1)
	}
	h.held[hdr] = v
}

func (h *BodyHolds) drop(hdr *fasthttp.RequestHeader) {
	delete(h.held, hdr)
	h.holds.Add(-1)
}

// reclaim releases the holds older than the read timeout; h.mu is held.
func (h *BodyHolds) reclaim() (n int64) {
	now := time.Now()
	for k, v := range h.held {
		if !v.refused && now.Sub(v.at) > h.stale {
			h.drop(k)
			h.b.Release(v.n)
			n += v.n
		}
	}
	return n
}

// claim takes the hold of the request whose header is hdr: the bytes
// reserved for its body (to release when the body is let go), and whether
// the body was refused.
func (h *BodyHolds) claim(hdr *fasthttp.RequestHeader) (n int64, refused bool) {
	if h.holds.Load() == 0 {
		return 0, false // HeaderReceived, on this goroutine, put none
	}
	h.mu.Lock()
	v, ok := h.held[hdr]
	if ok {
		h.drop(hdr)
	}
	h.mu.Unlock()
	return v.n, v.refused
}

// Handler wraps a server's handler: it claims the request's hold, trims a
// chunked body's to the body read, and releases it when the handler
// returns (a request's body is not used past it).
func (h *BodyHolds) Handler(next fasthttp.RequestHandler) fasthttp.RequestHandler {
	return func(rc *fasthttp.RequestCtx) {
		n, _ := h.claim(&rc.Request.Header)
		if n == 0 {
			next(rc)
			return
		}
		if size := int64(len(rc.Request.Body())); size < n {
			h.b.Release(n - size)
			n = size
		}
		defer h.b.Release(n)
		next(rc)
	}
}

// ErrorClaim releases the hold of a request fasthttp failed to read and
// reports whether its body was refused by the budget (answered 503).
func (h *BodyHolds) ErrorClaim(rc *fasthttp.RequestCtx) (refused bool) {
	n, refused := h.claim(&rc.Request.Header)
	h.b.Release(n)
	return refused
}
