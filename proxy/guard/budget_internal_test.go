package guard

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

func TestBodyHoldsHeaderReceived(t *testing.T) {
	const maxBody = 1 << 20
	head := func(cl int) *fasthttp.RequestHeader {
		h := &fasthttp.RequestHeader{}
		h.SetMethod("POST")
		h.SetContentLength(cl) // -1: chunked
		return h
	}
	for _, tc := range []struct {
		name     string
		cl       int
		free     int64 // budget left
		held     int64 // reserved afterwards
		refused  bool
		maxBytes int // RequestConfig.MaxRequestBodySize
	}{
		{"small body: a connection's fixed cost", upstream.UnreservedBody, 0, 0, false, 0},
		{"large body reserved", 100 << 10, 1 << 20, 100 << 10, false, 0},
		{"chunked reserves the largest body", -1, 2 << 20, maxBody, false, 0},
		{"over the body limit: fasthttp's 413", maxBody + 1, 4 << 20, 0, false, 0},
		{"no room: refused before reading", 100 << 10, 50 << 10, 0, true, 1},
		{"chunked, no room", -1, 512 << 10, 0, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := upstream.NewBudget(tc.free, nil)
			h := newBodyHolds(b, maxBody, time.Minute)
			hdr := head(tc.cl)
			rc := h.HeaderReceived(hdr)
			assert.Equal(t, tc.maxBytes, rc.MaxRequestBodySize)
			assert.Equal(t, tc.held, b.Used())
			n, refused := h.claim(hdr)
			assert.Equal(t, tc.held, n)
			assert.Equal(t, tc.refused, refused)
			n, refused = h.claim(hdr)
			assert.Zero(t, n, "claimed once")
			assert.False(t, refused)
		})
	}
}

func TestBodyHoldsGiveBackUnclaimed(t *testing.T) {
	b := upstream.NewBudget(300<<10, nil)
	h := newBodyHolds(b, 1<<20, 0)
	first, second := &fasthttp.RequestHeader{}, &fasthttp.RequestHeader{}
	first.SetContentLength(200 << 10)
	h.HeaderReceived(first)
	assert.Equal(t, int64(200<<10), b.Used())
	// The same context reads its next head: the last hold was never claimed.
	first.SetContentLength(100 << 10)
	h.HeaderReceived(first)
	assert.Equal(t, int64(100<<10), b.Used())

	// A hold older than the read timeout is reclaimed when the budget runs
	// short (stale is the read timeout plus a second).
	h.stale = 0
	second.SetContentLength(250 << 10)
	assert.Zero(t, h.HeaderReceived(second).MaxRequestBodySize, "the stale hold made room")
	assert.Equal(t, int64(250<<10), b.Used())
	n, _ := h.claim(first)
	assert.Zero(t, n)
}

func TestBodyHoldsHandlerTrimsAndReleases(t *testing.T) {
	b := upstream.NewBudget(4<<20, nil)
	h := newBodyHolds(b, 1<<20, time.Minute)
	rc := &fasthttp.RequestCtx{}
	rc.Request.Header.SetContentLength(-1)
	h.HeaderReceived(&rc.Request.Header)
	rc.Request.SetBody(make([]byte, 64<<10))
	var during int64
	h.Handler(func(*fasthttp.RequestCtx) { during = b.Used() })(rc)
	assert.Equal(t, int64(64<<10), during, "a chunked body's hold is trimmed to its size")
	assert.Zero(t, b.Used(), "released when the handler returns")
}
