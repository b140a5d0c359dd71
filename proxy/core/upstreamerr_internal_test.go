package core

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/failure"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// secretAnswers are upstream answers the sidecar refuses, each carrying a
// marker that must never reach an error's text.
var secretAnswers = []struct{ name, answer string }{
	{"bad content-length", "HTTP/1.1 200 OK\r\nSet-Cookie: session=SECRET-1\r\nContent-Length: zz\r\n\r\n{}"},
	{"bad status line", "HTTP/1.1 2OO SECRET-2\r\nContent-Length: 2\r\n\r\n{}"},
	{"garbage", "SECRET-3\x00\x01\x02 not http at all\r\n\r\n"},
	{"head past the buffer", "HTTP/1.1 200 OK\r\nX-Pad: SECRET-4" + strings.Repeat("a", 2*fuzzAnswerHead) + "\r\n\r\n"},
	{"bad chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nS\r\nSECRET-5\r\n0\r\n\r\n"},
	{"switching protocols", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: SECRET-6\r\n\r\n"},
}

// TestUpstreamErrorsSayNoBytes: whatever an upstream answers, the error it
// becomes on either path (fasthttp's upstream.ReadAnswer, the lane's parser), as the
// local engine's or a prefiller's, says in fixed words which upstream failed
// and why: neither the client's error body nor the log line's text holds the
// answer's bytes, and the body does not name the upstream's address, which
// the log line has in a field of its own. What the error is, for classify,
// is unchanged.
func TestUpstreamErrorsSayNoBytes(t *testing.T) {
	const addr = "10.9.9.9:8200"
	for _, tc := range secretAnswers {
		for _, path := range []string{"fasthttp", "lane"} {
			t.Run(tc.name+"/"+path, func(t *testing.T) {
				v := answerByTransport([]byte(tc.answer))
				if path == "lane" {
					v = answerByLane([]byte(tc.answer), len(tc.answer)/2)
				}
				require.Error(t, v.err)
				require.ErrorIs(t, v.err, upstream.ErrBadUpstreamAnswer)
				assert.NotContains(t, v.err.Error(), "SECRET", "the parser's verdict")
				leg := &upstream.LegError{Addr: addr, Op: "read", Err: v.err}
				assert.NotContains(t, leg.Error(), "SECRET")
				for _, e := range []struct {
					err    error
					role   upstream.Role
					status int
					reason string
				}{
					{DecodeTransportErr(leg), upstream.RoleEngine, 502, ""},
					{PrefillTransportErr(leg), upstream.RolePrefiller, 502, failure.ReasonBadAnswer},
				} {
					body := string(ErrorBody(failure.Of(e.err).Status, e.err))
					assert.NotContains(t, body, "SECRET")
					assert.NotContains(t, body, "10.9.9.9", "the upstream's address")
					assert.Contains(t, body, string(e.role)+": answer refused: ", body)
					assert.NotContains(t, e.err.Error(), "SECRET", "the log line's text")
					assert.Equal(t, addr, upstream.UpstreamAddr(e.err), "the log line's upstream field")
					assert.Equal(t, e.status, failure.Of(e.err).Status)
					assert.Equal(t, e.reason, failure.Of(e.err).Reason)
				}
			})
		}
	}
}

// TestReasonOf: each way an exchange fails has its fixed words, and the
// sentinels classify maps survive the naming.
func TestReasonOf(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Addr: &net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 8000},
		Err: &net.AddrError{Err: "x"}}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&upstream.LegError{Addr: "a:1", Op: "dial", Err: syscall.ECONNREFUSED}, "connection refused"},
		{&upstream.LegError{Addr: "a:1", Op: "read", Err: syscall.ECONNRESET}, "connection reset"},
		{&upstream.LegError{Addr: "a:1", Op: "read", Err: io.ErrUnexpectedEOF}, "connection closed before the answer was whole"},
		{&upstream.LegError{Addr: "a:1", Op: "read", Err: context.DeadlineExceeded}, "timed out"},
		{&upstream.LegError{Addr: "a:1", Op: "read", Err: fmt.Errorf("%w (Content-Length 9)", upstream.ErrAnswerTooLarge)}, "answer refused: longer than --max-upstream-answer-bytes"},
		{&upstream.LegError{Addr: "a:1", Op: "dial", Err: &net.DNSError{Name: "SECRET.example", Err: "no such host"}}, "host name not resolved"},
		{&upstream.LegError{Addr: "a:1", Op: "dial", Err: refused}, "exchange failed"},
		{&upstream.LegError{Addr: "a:1", Op: "read", Err: syscall.EHOSTUNREACH}, "no route to host"},
	} {
		assert.Equal(t, tc.want, reasonOf(tc.err), "%v", tc.err)
	}
	assert.ErrorIs(t, DecodeTransportErr(&upstream.LegError{Addr: "a:1", Op: "dial", Err: syscall.ECONNREFUSED}), ErrDecodeUnavailable)
	assert.ErrorIs(t, PrefillTransportErr(&upstream.LegError{Addr: "a:1", Op: "dial", Err: syscall.ECONNREFUSED}), ErrPrefillUnreachable)
	timedOut := PrefillTransportErr(fmt.Errorf("%w (after %w)", split.ErrPrefillTimeout,
		PrefillTransportErr(&upstream.LegError{Addr: "a:1", Op: "dial", Err: syscall.ECONNREFUSED})))
	assert.ErrorIs(t, timedOut, split.ErrPrefillTimeout)
	assert.Equal(t, "prefill timed out (after prefiller unreachable: prefiller: connection refused)", timedOut.Error(),
		"named once")
	tooLong := PrefillTransportErr(&upstream.LegError{Addr: "a:1", Op: "read", Err: upstream.ErrAnswerTooLarge})
	assert.ErrorIs(t, tooLong, connectors.ErrBadPrefillAnswer)
	assert.Equal(t, failure.ReasonBadAnswer, failure.Of(tooLong).Reason)
}
