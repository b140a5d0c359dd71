package upstream

import (
	"bufio"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// answerBudgetCases are answers read whole against a buffer budget: each
// reader of a whole answer (readAnswerBody for Transport.Do, Leg.ReadAll,
// and the lane's, which has these cases too) must reserve before it keeps
// bytes, refuse with ErrBufferBudget what does not fit, and give
// everything back.
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
		err: ErrBufferBudget},
	{name: "small answer needs no room", answer: withLength(1 << 10), budget: 1 << 20, used: 1 << 20, size: 1 << 10},
	{name: "chunked answer growing within the budget", answer: chunked(300<<10, 10<<10), budget: 1 << 20, size: 300 << 10},
	{name: "chunked answer growing past the budget", answer: chunked(300<<10, 10<<10), budget: 200 << 10, err: ErrBufferBudget},
	{name: "chunked answer past what others left", answer: chunked(300<<10, 10<<10), budget: 1 << 20, used: 900 << 10,
		err: ErrBufferBudget},
	{name: "close-delimited answer that fits", answer: untilClose(100 << 10), budget: 1 << 20, size: 100 << 10},
	{name: "close-delimited answer past the budget", answer: untilClose(400 << 10), budget: 256 << 10, err: ErrBufferBudget},
}

func withLength(n int) string {
	return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", n, strings.Repeat("x", n))
}

func chunked(n, chunk int) string {
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
func checkHeld(t *testing.T, b *Budget, used int64, hold *AnswerHold, got []byte, err error, size int, want error) {
	t.Helper()
	if want != nil {
		require.ErrorIs(t, err, want)
		assert.LessOrEqual(t, b.Used(), b.max, "never past the bound")
	} else {
		require.NoError(t, err)
		assert.Equal(t, size, len(got))
		if size > UnreservedBody {
			held := b.Used() - used
			assert.GreaterOrEqual(t, held, int64(size), "the body is reserved while held")
			assert.LessOrEqual(t, held, max(2*int64(size)+1, AnswerStep), "in steps no larger than doubling")
		}
	}
	hold.Release()
	hold.Release() // a second release gives back nothing more
	assert.Equal(t, used, b.Used(), "everything given back")
}

func TestReadAnswerBodyReservesFromTheBudget(t *testing.T) {
	for _, tc := range answerBudgetCases {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBudget(tc.budget, nil)
			require.True(t, b.TryReserve(tc.used))
			br := bufio.NewReader(strings.NewReader(tc.answer))
			var resp fasthttp.Response
			hold := AnswerHold{b: b}
			err := ReadAnswer(br, &resp, false, 8<<20, &hold)
			checkHeld(t, b, tc.used, &hold, resp.Body(), err, tc.size, tc.err)
		})
	}
}

func TestLegReadAllReservesFromTheBudget(t *testing.T) {
	for _, tc := range answerBudgetCases {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBudget(tc.budget, nil)
			require.True(t, b.TryReserve(tc.used))
			br := bufio.NewReader(strings.NewReader(tc.answer))
			var resp fasthttp.Response
			require.NoError(t, ReadAnswer(br, &resp, true, 8<<20, nil))
			l := &Leg{ctx: context.Background(), br: br, body: bodyDecoder(&resp), declared: resp.Header.ContentLength(), budget: b}
			got, hold, err := l.ReadAll(8 << 20)
			if err != nil {
				assert.Equal(t, tc.used, b.Used(), "a failed read holds nothing")
			}
			checkHeld(t, b, tc.used, &hold, got, err, tc.size, tc.err)
		})
	}
}
