package core

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/failure"
	"github.com/pd-sidecar/pd-sidecar/proxy/rawhttp"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// answerBudgetCases are answers read whole against a buffer budget: the
// lane's reader of a whole answer (rawhttp.Answer), as the transport's readers
// (whose tests have the same cases), must reserve before it keeps bytes,
// refuse with upstream.ErrBufferBudget what does not fit, and give everything back.
var answerBudgetCases = []struct {
	name   string
	answer string // head and framed body
	budget int64
	used   int64 // reserved by others already
	size   int   // the body's length
	err    error // nil: read whole
}{
	{name: "declared length that fits", answer: withLength(100 << 10), budget: 1 << 20, size: 100 << 10},
	{name: "declared length refused before it is read", answer: withLength(100 << 10), budget: 1 << 20, used: 1<<20 - 64<<10,
		err: upstream.ErrBufferBudget},
	{name: "small answer needs no room", answer: withLength(1 << 10), budget: 1 << 20, used: 1 << 20, size: 1 << 10},
	{name: "chunked answer growing within the budget", answer: chunkedAnswer(300<<10, 10<<10), budget: 1 << 20, size: 300 << 10},
	{name: "chunked answer growing past the budget", answer: chunkedAnswer(300<<10, 10<<10), budget: 200 << 10, err: upstream.ErrBufferBudget},
	{name: "chunked answer past what others left", answer: chunkedAnswer(300<<10, 10<<10), budget: 1 << 20, used: 900 << 10,
		err: upstream.ErrBufferBudget},
	{name: "close-delimited answer that fits", answer: untilClose(100 << 10), budget: 1 << 20, size: 100 << 10},
	{name: "close-delimited answer past the budget", answer: untilClose(400 << 10), budget: 256 << 10, err: upstream.ErrBufferBudget},
}

func withLength(n int) string {
	return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", n, strings.Repeat("x", n))
}

func chunkedAnswer(n, chunk int) string {
	var b strings.Builder
	b.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
	for n > 0 {
		c := min(chunk, n)
		fmt.Fprintf(&b, "%x\r\n%s\r\n", c, strings.Repeat("x", c))
		n -= c
	}
	b.WriteString("0\r\n\r\n")
	return b.String()
}

func untilClose(n int) string {
	return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n" + strings.Repeat("x", n)
}

// checkHeld checks what a reader holds after reading a case's answer.
func checkHeld(t *testing.T, b *upstream.Budget, bound, used int64, hold *upstream.AnswerHold, got []byte, err error, size int, want error) {
	t.Helper()
	if want != nil {
		require.ErrorIs(t, err, want)
		assert.LessOrEqual(t, b.Used(), bound, "never past the bound")
	} else {
		require.NoError(t, err)
		assert.Equal(t, size, len(got))
		if size > upstream.UnreservedBody {
			held := b.Used() - used
			assert.GreaterOrEqual(t, held, int64(size), "the body is reserved while held")
			assert.LessOrEqual(t, held, max(2*int64(size)+1, upstream.AnswerStep), "in steps no larger than doubling")
		}
	}
	hold.Release()
	hold.Release() // a second release gives back nothing more
	assert.Equal(t, used, b.Used(), "everything given back")
}

func TestLaneRawAnswerReservesFromTheBudget(t *testing.T) {
	for _, tc := range answerBudgetCases {
		t.Run(tc.name, func(t *testing.T) {
			b := upstream.NewBudget(tc.budget, nil)
			require.True(t, b.TryReserve(tc.used))
			br := bufio.NewReader(strings.NewReader(tc.answer))
			var resp fasthttp.Response
			require.NoError(t, upstream.ReadAnswer(br, &resp, true, 8<<20, nil))
			a := &rawhttp.Answer{Body: upstream.HeadDecoder(&resp.Header), Max: 8 << 20, Hold: upstream.NewAnswerHold(b)}
			err := a.Begin(&resp.Header)
			rest, rerr := io.ReadAll(br)
			require.NoError(t, rerr)
			for err == nil && len(rest) > 0 {
				n := min(len(rest), 16<<10) // as reads from the upstream come
				err = a.Feed(rest[:n])
				rest = rest[n:]
			}
			checkHeld(t, b, tc.budget, tc.used, &a.Hold, a.Buf, err, tc.size, tc.err)
		})
	}
}

// upstream.Transport.Do holds an answer's reservation until the caller releases it,
// and fails an answer the budget refuses with nothing held.
func TestTransportDoHoldsTheAnswer(t *testing.T) {
	body := bytes.Repeat([]byte("y"), 200<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		_, _ = w.Write(body)
	}))
	defer srv.Close()
	addr := srv.Listener.Addr().String()
	b := upstream.NewBudget(300<<10, nil)
	tr := upstream.NewTransport(time.Second, 8, 8)
	tr.SetAnswerBudget(b)
	do := func() (upstream.AnswerHold, error) {
		resp := fasthttp.AcquireResponse()
		defer fasthttp.ReleaseResponse(resp)
		return tr.Do(context.Background(), addr, newReq(addr, "/"), resp)
	}
	hold, err := do()
	require.NoError(t, err)
	assert.Equal(t, int64(len(body)), b.Used(), "the declared length is held")
	_, err = do()
	require.ErrorIs(t, err, upstream.ErrBufferBudget, "no room for a second answer")
	assert.ErrorIs(t, PrefillTransportErr(err), upstream.ErrBufferBudget)
	o := failure.Of(PrefillTransportErr(err))
	assert.Equal(t, failure.ReasonBufferBudget, o.Reason, "a prefill answer refused falls back")
	assert.False(t, o.Retry)
	assert.Equal(t, http.StatusServiceUnavailable, failure.Of(DecodeTransportErr(err)).Status)
	assert.Equal(t, int64(len(body)), b.Used(), "the refused answer holds nothing")
	hold.Release()
	assert.Zero(t, b.Used())
	hold, err = do()
	require.NoError(t, err, "room again")
	hold.Release()
	assert.Zero(t, b.Used())
}
