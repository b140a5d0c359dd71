package rawhttp_test

import (
	"bufio"
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// TestAnswerInReads: an answer read as the lane reads it, one byte a read
// (the head parsed again over what came, the body fed as it comes), gives
// the status and body of the answer after any interim 100 Continue, or
// refuses it as the fasthttp path's reader does. (FuzzUpstreamAnswer, in
// the proxy package, holds the two readers to the same verdicts over any
// bytes.)
func TestAnswerInReads(t *testing.T) {
	for _, tc := range []struct {
		name, answer string
		max          int64
		status       int
		body         string
		excess       bool
		err          error
	}{
		{name: "length", answer: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", max: 16, status: 200, body: "{}"},
		{name: "chunked", answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", max: 16, status: 200, body: "{}"},
		{name: "interim skipped", answer: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 400 Bad Request\r\nContent-Length: 1\r\n\r\nx", max: 16, status: 400, body: "x"},
		{name: "bytes after the body", answer: "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nxy", max: 16, status: 200, body: "x", excess: true},
		{name: "declared past the bound", answer: "HTTP/1.1 200 OK\r\nContent-Length: 17\r\n\r\n", max: 16, err: upstream.ErrAnswerTooLarge},
		{name: "chunked past the bound", answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n11\r\n" + string(bytes.Repeat([]byte("x"), 17)) + "\r\n0\r\n\r\n", max: 16, err: upstream.ErrAnswerTooLarge},
		{name: "switching protocols", answer: "HTTP/1.1 101 Switching Protocols\r\n\r\n", max: 16, err: upstream.ErrBadUpstreamAnswer},
		{name: "head past the buffer", answer: "HTTP/1.1 200 OK\r\nX-Pad: " + string(bytes.Repeat([]byte("a"), 64)), max: 16, err: upstream.ErrBadUpstreamAnswer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const maxHead = 48
			var h fasthttp.ResponseHeader
			h.DisableNormalizing()
			var rd bytes.Reader
			br := bufio.NewReaderSize(nil, maxHead)
			var head []byte
			var a *rawhttp.Answer
			interim := 0
			var err error
			for i := 0; i < len(tc.answer) && err == nil; i++ {
				in := []byte(tc.answer[i : i+1])
				if a != nil {
					err = a.Feed(in)
					continue
				}
				head = append(head, in...)
				var rest []byte
				var whole bool
				if rest, whole, err = rawhttp.ParseAnswerHead(&h, &rd, br, head, maxHead, &interim); err != nil || !whole {
					head = append(head[:0], rest...)
					continue
				}
				a = &rawhttp.Answer{Body: upstream.HeadDecoder(&h), Status: h.StatusCode(), Max: tc.max}
				h.CopyTo(&a.Head)
				if err = a.Begin(&h); err == nil {
					err = a.Feed(rest)
				}
			}
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.NotNil(t, a)
			assert.True(t, a.Body.Done())
			assert.Equal(t, tc.status, a.Status)
			assert.Equal(t, tc.body, string(a.Buf))
			assert.Equal(t, tc.excess, a.Excess)
		})
	}
}
