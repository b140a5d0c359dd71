package proxy

import (
	"net"
	"sync/atomic"

	"github.com/valyala/fasthttp"
)

// clientConn is a plain TCP client connection of a data port, as fasthttp
// serves it. It lets a stream move to an event loop (loopstream.go) in the
// middle of its answer, which fasthttp has no hook for:
//
//   - The stream ends fasthttp's writing with errHandedOver; fasthttp then
//     closes the connection, and Close runs the hand-off instead.
//   - fasthttp may have read bytes past a request (a pipelined next one)
//     into a buffer the stream cannot see, and those would be lost; so the
//     connection counts the bytes read from it and the handler the bytes
//     of the requests it saw (wireSize), and a stream moves only when the
//     two are equal.
type clientConn struct {
	*net.TCPConn
	read     atomic.Int64
	consumed atomic.Int64
	handOff  func() // run by Close instead of closing; set by handOver
}

// Read implements net.Conn.
func (c *clientConn) Read(p []byte) (int, error) {
	n, err := c.TCPConn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// Close implements net.Conn: it closes the connection, unless a stream
// took it over (then the stream's loop has it now).
func (c *clientConn) Close() error {
	if h := c.handOff; h != nil {
		c.handOff = nil
		h()
		return nil
	}
	return c.TCPConn.Close()
}

// counted adds the request of rc to the bytes its connection's requests
// took.
func counted(rc *fasthttp.RequestCtx) {
	if c, ok := rc.Conn().(*clientConn); ok {
		c.consumed.Add(wireSize(rc))
	}
}

// wireSize is the request's size on the wire, for a request line and
// headers ended by CRLF (the norm) and a body sent with a Content-Length.
// Any other framing gives a different size, which only keeps the
// connection's streams on their goroutines.
func wireSize(rc *fasthttp.RequestCtx) int64 {
	h := &rc.Request.Header
	n := len(h.Method()) + 1 + len(h.RequestURI()) + 1 + len(h.Protocol()) + 2 + len(h.RawHeaders())
	if h.ContentLength() > 0 {
		n += h.ContentLength()
	}
	return int64(n)
}

// clientListener accepts clientConns.
type clientListener struct{ net.Listener }

// Accept implements net.Listener.
func (l clientListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		return &clientConn{TCPConn: tc}, nil
	}
	return c, nil
}
