package proxy

import (
	"io"
	"net"
	"sync/atomic"
	"time"

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
//
// With the lane (lane.go) a connection also moves between fasthttp and the
// event loops between requests: the lane gives fasthttp a connection whose
// next request it does not serve itself, with the bytes it read of it
// (replay); and when fasthttp, done with that request, reads for the next
// one, Read ends fasthttp's part (io.EOF, which fasthttp takes for a
// client that closed while idle) and Close gives the connection back to
// the lane.
type clientConn struct {
	*net.TCPConn
	read     atomic.Int64
	consumed atomic.Int64
	// handOff is run by Close instead of closing; set by handOver and by
	// Read (atomic: fasthttp's Shutdown closes idle connections from
	// another goroutine).
	handOff atomic.Pointer[func()]

	lane   *lane  // the lane idle connections go back to (nil: none)
	replay []byte // bytes the lane read, given to fasthttp first
	busy   atomic.Bool
	// stay keeps the connection on fasthttp for its next request: its last
	// one was a P/D split that the lane does not serve (laneSplits), which
	// it would only hand back (a connection from the endpoint picker
	// carries mostly those).
	stay atomic.Bool
	// linger: the connection closes after an error answer to a request
	// that may not have been read whole (serverError); see Close.
	linger atomic.Bool
}

// Read implements net.Conn.
func (c *clientConn) Read(p []byte) (int, error) {
	if len(c.replay) > 0 {
		n := copy(p, c.replay)
		c.replay = c.replay[n:]
		c.read.Add(int64(n))
		return n, nil
	}
	if c.lane != nil && c.handOff.Load() == nil && !c.busy.Load() && !c.stay.Load() && c.read.Load() == c.consumed.Load() {
		// fasthttp waits for the next request: the lane takes the connection.
		adopt := func() { c.lane.adopt(c) }
		c.handOff.Store(&adopt)
		return 0, io.EOF
	}
	n, err := c.TCPConn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// Close implements net.Conn: it closes the connection, unless a stream
// took it over (then the stream's loop has it now). After an error answer
// it closes lingering, as nginx's lingering_close: a socket closed with
// unread bytes is reset, and a client still writing the rest of its
// request (a too-large head or body) would get the reset instead of the
// answer; so the write side is shut and what the client still sends is
// read and dropped, for up to lingerFor or lingerMax bytes, before the
// close.
func (c *clientConn) Close() error {
	if h := c.handOff.Swap(nil); h != nil {
		(*h)()
		return nil
	}
	if c.linger.Load() {
		if err := c.TCPConn.CloseWrite(); err == nil {
			go c.drain()
			return nil
		}
	}
	return c.TCPConn.Close()
}

// Bounds of a lingering close.
const (
	lingerFor = 500 * time.Millisecond
	lingerMax = 1 << 20
)

func (c *clientConn) drain() {
	_ = c.TCPConn.SetReadDeadline(time.Now().Add(lingerFor))
	_, _ = io.Copy(io.Discard, io.LimitReader(c.TCPConn, lingerMax))
	_ = c.TCPConn.Close()
}

// counted adds the request of rc to the bytes its connection's requests
// took, and marks the connection busy until the returned func is called
// (when the handler returns): reads meanwhile (a connWatch's) are no
// request boundary.
func counted(rc *fasthttp.RequestCtx) func() {
	c, ok := rc.Conn().(*clientConn)
	if !ok {
		return func() {}
	}
	c.consumed.Add(wireSize(rc))
	c.busy.Store(true)
	c.stay.Store(c.lane != nil && !c.lane.p.laneSplits() && len(rc.Request.Header.Peek(HeaderPrefiller)) > 0)
	return c.idle
}

func (c *clientConn) idle() { c.busy.Store(false) }

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
type clientListener struct {
	net.Listener
	lane *lane // nil: none
}

// Accept implements net.Listener.
func (l clientListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		return &clientConn{TCPConn: tc, lane: l.lane}, nil
	}
	return c, nil
}
