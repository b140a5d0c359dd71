package proxy

import (
	"bytes"
	"io"
	"net"
	"sync"
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
//     two are equal (synced).
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
	// readBy, when not zero (Unix nanoseconds), is the latest read
	// deadline fasthttp may set while it reads the request the lane gave
	// it part of (lane.toServer): --read-timeout from when the lane began
	// to read it, not from when fasthttp did. Cleared once the request is
	// read (counted).
	readBy atomic.Int64

	// The count of a request's bytes is what fasthttp's parser took, not
	// what a well-formed request would take: line measures the request
	// line of the request fasthttp reads next from the bytes as they are
	// read, and tail is a copy of the end of the last read, where a
	// request read ahead (pipelined) begins. Both are used by the
	// goroutine serving the connection only. lost: a request's bytes
	// could not be counted exactly (a chunked body, a byte taken by a
	// connWatch); the two counts are never compared again, and the
	// connection stays fasthttp's until it closes.
	line  lineScan
	tail  []byte
	tails *tailPool // nil: the counts are not kept exact
	lost  atomic.Bool
}

// synced reports whether fasthttp holds no byte read from the connection
// that its handler did not see: the connection is between requests.
func (c *clientConn) synced() bool {
	return !c.lost.Load() && c.read.Load() == c.consumed.Load()
}

// Read implements net.Conn.
func (c *clientConn) Read(p []byte) (int, error) {
	if len(c.replay) > 0 {
		n := copy(p, c.replay)
		c.replay = c.replay[n:]
		c.account(p[:n])
		return n, nil
	}
	if c.lane != nil && c.handOff.Load() == nil && !c.busy.Load() && !c.stay.Load() && c.synced() {
		// fasthttp waits for the next request: the lane takes the connection.
		adopt := func() { c.lane.adopt(c) }
		c.handOff.Store(&adopt)
		return 0, io.EOF
	}
	n, err := c.TCPConn.Read(p)
	c.account(p[:n])
	return n, err
}

// SetReadDeadline implements net.Conn, never past readBy while that is
// set.
func (c *clientConn) SetReadDeadline(t time.Time) error {
	if by := c.readBy.Load(); by != 0 && (t.IsZero() || t.UnixNano() > by) {
		t = time.Unix(0, by)
	}
	return c.TCPConn.SetReadDeadline(t)
}

// account counts b, the next bytes read: a request that begins with them
// has its request line measured, and the end of b is kept in tail.
func (c *clientConn) account(b []byte) {
	if len(b) == 0 {
		return
	}
	at := c.read.Add(int64(len(b))) - int64(len(b))
	if c.busy.Load() {
		// A connWatch's read, while the handler runs: the byte of a
		// pipelined request, which fasthttp will never see (the
		// connection closes after the answer).
		c.lost.Store(true)
		return
	}
	if c.tails == nil || c.lost.Load() {
		return
	}
	if c.line.state == lineIdle && at == c.consumed.Load() {
		c.line.begin(at, c.tails.size)
	}
	c.line.feed(b)
	if c.tail == nil {
		c.tail = c.tails.get()
	}
	keep := min(len(b), cap(c.tail))
	c.tail = append(c.tail[:0], b[len(b)-keep:]...)
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
	// After an error answer (linger) the connection closes, even when a
	// read armed the lane's hand-off: that answer said Connection: close.
	if h := c.handOff.Swap(nil); h != nil && !c.linger.Load() {
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
	c.readBy.Store(0) // the request is read
	c.count(&rc.Request.Header)
	c.busy.Store(true)
	c.stay.Store(c.lane != nil && !c.lane.p.laneSplits() && len(rc.Request.Header.Peek(HeaderPrefiller)) > 0)
	return c.idle
}

func (c *clientConn) idle() { c.busy.Store(false) }

// holdConn marks rc's client connection busy again until the returned func
// is called, for a connWatch that reads it after the handler returned (a
// body stream that waits on an upstream between its writes): such a read
// is no request boundary, so it must not hand the connection to the lane
// (Read's io.EOF), which the watch would take for the client leaving.
func holdConn(rc *fasthttp.RequestCtx) func() {
	c, ok := rc.Conn().(*clientConn)
	if !ok {
		return func() {}
	}
	c.busy.Store(true)
	return c.idle
}

// count adds the request with head h, which fasthttp read from the
// connection, to consumed, and begins measuring the request line of a
// request read ahead of it.
func (c *clientConn) count(h *fasthttp.RequestHeader) {
	if c.tails == nil {
		c.consumed.Add(wireSize(h, 0, false))
		return
	}
	line, ok := c.line.length(c.consumed.Load())
	c.line = lineScan{}
	n := wireSize(h, line, true)
	if !ok || n < 0 || c.lost.Load() {
		c.lose()
		return
	}
	at := c.consumed.Add(n)
	ahead := c.read.Load() - at
	switch {
	case ahead == 0:
		c.putTail()
	case ahead < 0 || ahead > int64(len(c.tail)):
		c.lose() // never, as long as the counts are exact
	default:
		// The next request was read with this one, in the last read (the
		// parser reads only for the request it reads): measure its request
		// line from there; the tail stays for the requests behind it.
		c.line.begin(at, c.tails.size)
		c.line.feed(c.tail[int64(len(c.tail))-ahead:])
	}
}

// lose takes the connection out of the comparison of the counts.
func (c *clientConn) lose() {
	c.lost.Store(true)
	c.putTail()
}

// putTail gives tail back to the pool: it is kept only from a read to the
// count of the last request the read holds.
func (c *clientConn) putTail() {
	if c.tail != nil {
		c.tails.put(c.tail)
		c.tail = nil
	}
}

// wireSize is the size on the wire of the request with head h: its
// request line (line bytes, with the blank lines before it, when
// measured; else the CRLF-ended line a client writes), its header fields
// and blank line as fasthttp read them, and a body sent with a
// Content-Length. With measured, -1 stands for a size that cannot be known
// from h: a chunked body, or a head with no field.
func wireSize(h *fasthttp.RequestHeader, line int, measured bool) int64 {
	if !measured {
		line = len(h.Method()) + 1 + len(h.RequestURI()) + 1 + len(h.Protocol()) + 2
	}
	cl := h.ContentLength()
	if measured && (cl == -1 || len(h.RawHeaders()) == 0) {
		return -1
	}
	return int64(line + len(h.RawHeaders()) + max(cl, 0))
}

// lineScan measures a request line as fasthttp's parser takes it: the
// bytes up to the LF that ends the first line that is not blank. Blank
// lines before a request line are skipped, a bare LF ends a line as CRLF
// does, and a CR before the LF is not part of the line.
type lineScan struct {
	state lineState
	start int64 // the stream offset of the request's first byte
	n     int   // bytes seen from start
	line  int   // bytes of the current line seen
	cr    bool  // the last byte seen was CR
	limit int   // the most bytes a request line may take
}

type lineState uint8

const (
	lineIdle     lineState = iota // no request begun
	lineScanning                  // the request line is not whole yet
	lineDone                      // n is its length
	lineTooLong                   // longer than limit: no request fasthttp reads
)

func (s *lineScan) begin(at int64, limit int) {
	*s = lineScan{state: lineScanning, start: at, limit: limit}
}

// feed scans b, the next bytes of the request.
func (s *lineScan) feed(b []byte) {
	for s.state == lineScanning && len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			s.n += len(b)
			s.line += len(b)
			s.cr = b[len(b)-1] == '\r'
			b = nil
		} else {
			if i > 0 {
				s.cr = b[i-1] == '\r'
			}
			s.line += i
			s.n += i + 1
			if s.cr {
				s.line--
			}
			if s.line > 0 {
				s.state = lineDone
				return
			}
			s.line, s.cr = 0, false
			b = b[i+1:]
		}
		if s.n > s.limit {
			s.state = lineTooLong
		}
	}
}

// length is the measured request line of the request that began at
// stream offset at.
func (s *lineScan) length(at int64) (int, bool) {
	return s.n, s.state == lineDone && s.start == at
}

// tailPool lends the copies of the ends of reads (clientConn.tail); size
// is fasthttp's read buffer (--max-header-bytes), the most it reads ahead.
type tailPool struct {
	size int
	pool sync.Pool
}

func newTailPool(size int) *tailPool { return &tailPool{size: size} }

func (t *tailPool) get() []byte {
	if b, ok := t.pool.Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return make([]byte, 0, t.size)
}

func (t *tailPool) put(b []byte) { t.pool.Put(&b) }

// clientListener accepts clientConns.
type clientListener struct {
	net.Listener
	lane  *lane     // nil: none
	tails *tailPool // nil: the byte counts are not kept exact (no event loops)
}

// Accept implements net.Listener.
func (l clientListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		return &clientConn{TCPConn: tc, lane: l.lane, tails: l.tails}, nil
	}
	return c, nil
}
