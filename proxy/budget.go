package proxy

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// ErrBufferBudget: buffering a request body, or an answer read whole,
// would take the bytes buffered by all connections together past
// --max-buffered-bytes (503; a prefill answer refused is a fallback,
// ReasonBufferBudget).
var ErrBufferBudget = errors.New("too many bytes buffered")

// budget bounds the bytes the sidecar buffers at once, all connections
// together (--max-buffered-bytes): request bodies read whole before they
// are served, and answers read whole. A reader reserves what it is about
// to buffer before reading it (TryReserve) and gives it back when the
// bytes are let go (Release); a reservation refused is answered 503 before
// anything more is read. Lock-free: one atomic counter.
type budget struct {
	max   int64
	used  atomic.Int64
	gauge prometheus.Gauge // the bytes reserved now (nil: none)
}

func newBudget(max int64, gauge prometheus.Gauge) *budget {
	return &budget{max: max, gauge: gauge}
}

// TryReserve reserves n bytes, or reports that they would take the budget
// past its bound (nothing is then reserved). n <= 0 always succeeds.
func (b *budget) TryReserve(n int64) bool {
	if n <= 0 {
		return true
	}
	for {
		u := b.used.Load()
		if u+n > b.max || u+n < u {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			if b.gauge != nil {
				b.gauge.Add(float64(n))
			}
			return true
		}
	}
}

// Release gives back n bytes reserved by TryReserve.
func (b *budget) Release(n int64) {
	if n <= 0 {
		return
	}
	b.used.Add(-n)
	if b.gauge != nil {
		b.gauge.Sub(float64(n))
	}
}

// Used reports the bytes reserved now.
func (b *budget) Used() int64 { return b.used.Load() }

// unreservedBody is the largest request body read without a reservation:
// a body the lane reads in its one read (its loop buffer) or fasthttp in
// its first reads, which is part of a connection's fixed cost (its read
// buffer is 8 KiB), as its head is. Bigger bodies, which only fasthttp's
// path buffers, are reserved.
const unreservedBody = 16 << 10

// bodyHolds wires the budget into fasthttp's reading of request bodies.
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
type bodyHolds struct {
	b       *budget
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

func newBodyHolds(b *budget, maxBody int, readTimeout time.Duration) *bodyHolds {
	return &bodyHolds{b: b, maxBody: int64(maxBody), stale: readTimeout + time.Second,
		held: map[*fasthttp.RequestHeader]bodyHold{}}
}

// headerReceived implements fasthttp.Server.HeaderReceived.
func (h *bodyHolds) headerReceived(hdr *fasthttp.RequestHeader) fasthttp.RequestConfig {
	n := int64(hdr.ContentLength())
	if n == -1 { // chunked
		n = h.maxBody
	}
	// A small body, none, or one fasthttp refuses itself (413) is not
	// reserved.
	reserve := n > unreservedBody && n <= h.maxBody
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
func (h *bodyHolds) put(hdr *fasthttp.RequestHeader, v bodyHold) {
	if _, ok := h.held[hdr]; !ok {
		h.holds.Add(1)
	}
	h.held[hdr] = v
}

func (h *bodyHolds) drop(hdr *fasthttp.RequestHeader) {
	delete(h.held, hdr)
	h.holds.Add(-1)
}

// reclaim releases the holds older than the read timeout; h.mu is held.
func (h *bodyHolds) reclaim() (n int64) {
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
func (h *bodyHolds) claim(hdr *fasthttp.RequestHeader) (n int64, refused bool) {
	if h.holds.Load() == 0 {
		return 0, false // headerReceived, on this goroutine, put none
	}
	h.mu.Lock()
	v, ok := h.held[hdr]
	if ok {
		h.drop(hdr)
	}
	h.mu.Unlock()
	return v.n, v.refused
}

// handler wraps a server's handler: it claims the request's hold, trims a
// chunked body's to the body read, and releases it when the handler
// returns (a request's body is not used past it).
func (h *bodyHolds) handler(next fasthttp.RequestHandler) fasthttp.RequestHandler {
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

// errorClaim releases the hold of a request fasthttp failed to read and
// reports whether its body was refused by the budget (answered 503).
func (h *bodyHolds) errorClaim(rc *fasthttp.RequestCtx) (refused bool) {
	n, refused := h.claim(&rc.Request.Header)
	h.b.Release(n)
	return refused
}

// bufferFull answers a request whose body the budget refused: 503, with
// Retry-After, counted as buffered_bytes.
func (p *Proxy) bufferFull(rc *fasthttp.RequestCtx) {
	p.reject(rc, metrics.RejectBufferedBytes, fasthttp.StatusServiceUnavailable,
		fmt.Errorf("%w (--max-buffered-bytes %d)", ErrBufferBudget, p.guard.cfg.MaxBufferedBytes))
	rc.Response.Header.Set("Retry-After", "1")
}
