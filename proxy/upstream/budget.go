package upstream

import (
	"net/http"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pd-sidecar/pd-sidecar/failure"
)

// ErrBufferBudget: buffering a request body, or an answer read whole,
// would take the bytes buffered by all connections together past
// --max-buffered-bytes (the client is answered 503 with Retry-After; a
// prefill answer refused is a fallback to a local prefill).
// Its outcome wins over those of an upstream's failures it is found with:
// the upstream may be fine, the refusal is the sidecar's.
var ErrBufferBudget error = failure.New("too many bytes buffered", failure.Outcome{Status: http.StatusServiceUnavailable, Reason: failure.ReasonBufferBudget, RetryAfter: true, Precedence: failure.PrecedenceBufferBudget})

// Budget bounds the bytes the sidecar buffers at once, all connections
// together (--max-buffered-bytes): request bodies read whole before they
// are served, and answers read whole. A reader reserves what it is about
// to buffer before reading it (TryReserve) and gives it back when the
// bytes are let go (Release); a reservation refused is answered 503 before
// anything more is read. Lock-free: one atomic counter. It implements
// BufferBudget.
type Budget struct {
	max   int64
	used  atomic.Int64
	gauge prometheus.Gauge // the bytes reserved now (nil: none)
}

// NewBudget returns a Budget of max bytes, whose reservations gauge shows
// (nil: none).
func NewBudget(max int64, gauge prometheus.Gauge) *Budget {
	return &Budget{max: max, gauge: gauge}
}

// TryReserve reserves n bytes, or reports that they would take the budget
// past its bound (nothing is then reserved). n <= 0 always succeeds.
func (b *Budget) TryReserve(n int64) bool {
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
func (b *Budget) Release(n int64) {
	if n <= 0 {
		return
	}
	b.used.Add(-n)
	if b.gauge != nil {
		b.gauge.Sub(float64(n))
	}
}

// Used reports the bytes reserved now.
func (b *Budget) Used() int64 { return b.used.Load() }

// UnreservedBody is the largest request body read without a reservation:
// a body the lane reads in its one read (its loop buffer) or fasthttp in
// its first reads, which is part of a connection's fixed cost (its read
// buffer is 8 KiB), as its head is. Bigger bodies, which only fasthttp's
// path buffers, are reserved; so is an answer read whole past this size
// (AnswerHold).
const UnreservedBody = 16 << 10

var _ BufferBudget = (*Budget)(nil)
