package upstream

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
// ("upstream", WithUpstream). A parser's error becomes an answerError at
// the parser (BadAnswer, AnswerHeadErr), so that the text of a failed
// exchange is fixed words all the way down.

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
	// Reason says what went wrong in fixed words (ReasonOf).
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

// answerError is an upstream answer the sidecar does not take
// (ErrBadUpstreamAnswer): why, in fixed words, and the parser's error,
// kept for errors.Is and errors.As but never printed.
type answerError struct {
	why   string
	cause error
}

// BadAnswer returns an error that is ErrBadUpstreamAnswer: an answer
// refused for why, in fixed words (its text), and cause, the parser's
// error (nil: none), kept for errors.Is and errors.As but never printed.
func BadAnswer(why string, cause error) error { return &answerError{why: why, cause: cause} }

// Error implements error.
func (e *answerError) Error() string { return ErrBadUpstreamAnswer.Error() + ": " + e.why }

// Unwrap returns ErrBadUpstreamAnswer and the parser's error.
func (e *answerError) Unwrap() []error {
	if e.cause == nil {
		return []error{ErrBadUpstreamAnswer}
	}
	return []error{ErrBadUpstreamAnswer, e.cause}
}

// ErrUpClosed: the engine closed the connection before the answer began.
var ErrUpClosed = errors.New("connection closed before the answer")

// ReasonOf says in fixed words why an exchange with an upstream failed, of
// the failures this package knows: a refused answer (and why), a timeout,
// a TLS handshake, a name not resolved, a connection refused, reset or
// closed, the system's own words for another errno, and else "exchange
// failed".
func ReasonOf(err error) string {
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
	case errors.Is(err, ErrBufferBudget):
		return "answer refused: no room in --max-buffered-bytes"
	case errors.Is(err, ErrFirstByteTimeout), errors.Is(err, context.DeadlineExceeded), IsTimeout(err):
		return "timed out"
	case errors.As(err, &rec), errors.As(err, &alert), errors.As(err, &cert), errors.As(err, &unknown), errors.As(err, &host):
		return "TLS handshake failed"
	case errors.As(err, &dns):
		return "host name not resolved"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case IsReset(err):
		return "connection reset"
	case errors.Is(err, ErrUpClosed), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, fasthttp.ErrConnectionClosed):
		return "connection closed before the answer was whole"
	case errors.As(err, &errno):
		return errno.Error() // the system's own words
	}
	return "exchange failed"
}

// UpstreamAddr is the address of the upstream whose failure err is (""
// when it names none): a log line's "upstream" field.
func UpstreamAddr(err error) string {
	var ue *UpstreamError
	if errors.As(err, &ue) {
		return ue.Addr
	}
	return ""
}

// WithUpstream adds the address of the upstream that failed (err's) to a
// log event.
func WithUpstream(ev *zerolog.Event, err error) *zerolog.Event {
	if a := UpstreamAddr(err); a != "" {
		return ev.Str("upstream", a)
	}
	return ev
}

// IsTimeout reports whether err is a timed-out read, write or dial.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, fasthttp.ErrDialTimeout) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// IsReset reports whether err is a connection reset by the peer, or a
// write to one it closed.
func IsReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
