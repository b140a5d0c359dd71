package proxy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
)

// What the sidecar says of an upstream that failed it, in an error answer
// and in a log line: which upstream (its role) and what went wrong (a
// reason), in fixed words. Never the upstream's bytes: a parser's error
// quotes what it could not parse (fasthttp's header errors quote the whole
// head, Set-Cookie and all), and an answer's body is the upstream's to
// choose. Never the upstream's address in an answer either: the local
// engine's is no business of the client's, and a prefiller's is already
// the client's own header; a log line carries it in a field of its own
// ("upstream").
//
// Every failed exchange reaches the request path as an UpstreamError,
// made where the role is known (prefillTransportErr, decodeTransportErr,
// the bootstrap query, an encoder leg, a KV engine call), wrapped by the
// sentinel classify maps (ErrDecodeFailed, ErrPrefillUnreachable...); a
// parser's error becomes an answerError at the parser (answerHeadErr,
// readAnswerBody, the lane's rawAnswer). The text of the chain is then
// fixed words all the way down, and clientMessage, which every error
// answer's message comes from, says it.

// Role names an upstream in what the sidecar says of it.
type Role string

// The upstreams the sidecar talks to.
const (
	// RolePrefiller is the prefill engine named by x-prefiller-host-port.
	RolePrefiller Role = "prefiller"
	// RoleEngine is the local (decode) engine.
	RoleEngine Role = "local engine"
	// RoleBootstrap is a prefiller's bootstrap server (Mooncake GET /query).
	RoleBootstrap Role = "bootstrap server"
	// RoleEncoder is an encoder of x-encoder-hosts-ports.
	RoleEncoder Role = "encoder"
	// RoleKVAgent is a prefiller's kvtransfer agent (--kv-connector
	// sidecar).
	RoleKVAgent Role = "KV agent"
)

// UpstreamError is a failed exchange with an upstream. Its text is its role
// and reason; Addr is for the log line, Err for errors.Is and errors.As:
// neither is in the text.
type UpstreamError struct {
	// Role is the upstream's part in the request.
	Role Role
	// Reason says what went wrong in fixed words (reasonOf).
	Reason string
	// Addr is the upstream's host:port ("" when not known).
	Addr string
	// Err is the cause, never printed: it may quote the upstream.
	Err error
}

// Error implements error: the role and the reason.
func (e *UpstreamError) Error() string { return string(e.Role) + ": " + e.Reason }

// Unwrap returns the cause.
func (e *UpstreamError) Unwrap() error { return e.Err }

// upstreamErr returns err, a failed exchange with an upstream of role at
// addr (the LegError's address in err when it has one), as an
// UpstreamError; an err that already holds one is returned as it is.
func upstreamErr(role Role, addr string, err error) error {
	var ue *UpstreamError
	if errors.As(err, &ue) {
		return err
	}
	var le *LegError
	if errors.As(err, &le) {
		addr = le.Addr
	}
	return &UpstreamError{Role: role, Reason: reasonOf(err), Addr: addr, Err: err}
}

// answerError is an upstream answer the sidecar does not take
// (ErrBadUpstreamAnswer): why, in fixed words, and the parser's error,
// kept for errors.Is and errors.As but never printed.
type answerError struct {
	why   string
	cause error
}

// badAnswer returns an answerError.
func badAnswer(why string, cause error) error { return &answerError{why: why, cause: cause} }

// Error implements error.
func (e *answerError) Error() string { return ErrBadUpstreamAnswer.Error() + ": " + e.why }

// Unwrap returns ErrBadUpstreamAnswer and the parser's error.
func (e *answerError) Unwrap() []error {
	if e.cause == nil {
		return []error{ErrBadUpstreamAnswer}
	}
	return []error{ErrBadUpstreamAnswer, e.cause}
}

// reasonOf says in fixed words why an exchange with an upstream failed.
func reasonOf(err error) string {
	var ae *answerError
	var errno syscall.Errno
	var dns *net.DNSError
	var rec tls.RecordHeaderError
	var alert tls.AlertError
	var cert *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	switch {
	case errors.As(err, &ae):
		return "answer refused: " + ae.why
	case errors.Is(err, ErrBadUpstreamAnswer):
		return "answer refused"
	case errors.Is(err, ErrEventTooLong):
		return "answer refused: an SSE event longer than --max-sse-event-bytes"
	case errors.Is(err, ErrBufferBudget):
		return "answer refused: no room in --max-buffered-bytes"
	case errors.Is(err, ErrFirstByteTimeout), errors.Is(err, ErrPrefillTimeout), errors.Is(err, ErrEncoderTimeout),
		errors.Is(err, context.DeadlineExceeded), isTimeout(err):
		return "timed out"
	case errors.As(err, &rec), errors.As(err, &alert), errors.As(err, &cert), errors.As(err, &unknown), errors.As(err, &host):
		return "TLS handshake failed"
	case errors.As(err, &dns):
		return "host name not resolved"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case isReset(err):
		return "connection reset"
	case errors.Is(err, errUpClosed), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, fasthttp.ErrConnectionClosed):
		return "connection closed before the answer was whole"
	case errors.As(err, &errno):
		return errno.Error() // the system's own words
	}
	return "exchange failed"
}

// endedEarly is the local engine's stream at addr that ended before what
// (its first event, its first output) for the reason err (io.EOF or nil:
// it ended cleanly, too soon).
func endedEarly(addr, what string, err error) error {
	why := "stream ended before " + what
	if err != nil && !errors.Is(err, io.EOF) {
		why += " (" + reasonOf(err) + ")"
	}
	var le *LegError
	if errors.As(err, &le) {
		addr = le.Addr
	}
	return &UpstreamError{Role: RoleEngine, Reason: why, Addr: addr, Err: err}
}

// upstreamAddr is the address of the upstream whose failure err is (""
// when it names none): a log line's "upstream" field.
func upstreamAddr(err error) string {
	var ue *UpstreamError
	if errors.As(err, &ue) {
		return ue.Addr
	}
	return ""
}

// withUpstream adds the address of the upstream that failed (err's) to a
// log event.
func withUpstream(ev *zerolog.Event, err error) *zerolog.Event {
	if a := upstreamAddr(err); a != "" {
		return ev.Str("upstream", a)
	}
	return ev
}

// clientMessage is what an error answer says of err: its text, which on
// the request path is fixed words (the sentinels, the sidecar's own
// wrapping, an UpstreamError's role and reason; never an upstream's bytes
// or address).
func clientMessage(err error) string { return err.Error() }
