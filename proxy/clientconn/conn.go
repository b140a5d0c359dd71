package clientconn

import (
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Adopter takes client connections between requests off fasthttp's path:
// the lane, whose event loops wait for a connection's next request.
type Adopter interface {
	// Adopt takes c, which waits for its next request; c is the
	// adopter's from then on.
	Adopt(c *Conn)
}

// Conn is a plain TCP client connection of a data port, as fasthttp
// serves it. It lets a stream move to an event loop in the middle of its
// answer, which fasthttp has no hook for:
//
//   - The stream ends fasthttp's writing with an error of its own, and
//     gives the connection its hand-off (HandOff); fasthttp then closes
//     the connection, and Close runs the hand-off instead.
//   - fasthttp may have read bytes past a request (a pipelined next one)
//     into a buffer the stream cannot see, and those would be lost; so the
//     connection counts the bytes read from it and the handler the bytes
//     of the requests it saw (Counted, wireSize), and a stream moves only
//     when the two are equal (Synced).
//
// With an Adopter (the lane) a connection also moves between fasthttp and
// the event loops between requests: the Adopter gives fasthttp a
// connection whose next request it does not serve itself, with the bytes
// it read of it (Replay); and when fasthttp, done with that request, reads
// for the next one, Read ends fasthttp's part (io.EOF, which fasthttp
// takes for a client that closed while idle) and Close gives the
// connection back to the Adopter.
type Conn struct {
	*net.TCPConn
	read     atomic.Int64
	consumed atomic.Int64
	// handOff is run by Close instead of closing; set by HandOff and by
	// Read (atomic: fasthttp's Shutdown closes idle connections from
	// another goroutine).
	handOff atomic.Pointer[func()]

	adopter Adopter // where idle connections go back to (nil: none)
	replay  []byte  // bytes the adopter read, given to fasthttp first
	busy    atomic.Bool
	// linger: the connection closes after an error answer to a request
	// that may not have been read whole (Linger); see Close.
	linger atomic.Bool
	// readBy, when not zero (Unix nanoseconds), is the latest read
	// deadline fasthttp may set while it reads the request the adopter
	// gave it part of (Replay): --read-timeout from when the adopter began
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
	// Watch); the two counts are never compared again, and the
	// connection stays fasthttp's until it closes.
	line  lineScan
	tail  []byte
	tails *TailPool // nil: the counts are not kept exact
	lost  atomic.Bool
}

// Synced reports whether fasthttp holds no byte read from the connection
// that its handler did not see: the connection is between requests.
func (c *Conn) Synced() bool {
	return !c.lost.Load() && c.read.Load() == c.consumed.Load()
}

// Read implements net.Conn.
func (c *Conn) Read(p []byte) (int, error) {
	if len(c.replay) > 0 {
		n := copy(p, c.replay)
		c.replay = c.replay[n:]
		c.account(p[:n])
		return n, nil
	}
	if c.adopter != nil && c.handOff.Load() == nil && !c.busy.Load() && c.Synced() {
		// fasthttp waits for the next request: the adopter takes the connection.
		adopt := func() { c.adopter.Adopt(c) }
		c.handOff.Store(&adopt)
		return 0, io.EOF
	}
	n, err := c.TCPConn.Read(p)
	c.account(p[:n])
	return n, err
}

// SetReadDeadline implements net.Conn, never past readBy while that is
// set.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if by := c.readBy.Load(); by != 0 && (t.IsZero() || t.UnixNano() > by) {
		t = time.Unix(0, by)
	}
	return c.TCPConn.SetReadDeadline(t)
}

// account counts b, the next bytes read: a request that begins with them
// has its request line measured, and the end of b is kept in tail.
func (c *Conn) account(b []byte) {
	if len(b) == 0 {
		return
	}
	at := c.read.Add(int64(len(b))) - int64(len(b))
	if c.busy.Load() {
		// A Watch's read, while the handler runs: the byte of a
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
func (c *Conn) Close() error {
	// After an error answer (linger) the connection closes, even when a
	// read armed the adopter's hand-off: that answer said Connection: close.
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

func (c *Conn) drain() {
	_ = c.TCPConn.SetReadDeadline(time.Now().Add(lingerFor))
	_, _ = io.Copy(io.Discard, io.LimitReader(c.TCPConn, lingerMax))
	_ = c.TCPConn.Close()
}

// HandOff makes Close run begin instead of closing: a stream took the
// connection over, and begin starts its part (fasthttp closes the
// connection once its writing ended). The caller checks Synced first.
func (c *Conn) HandOff(begin func()) { c.handOff.Store(&begin) }

// Replay gives c to fasthttp with in, the bytes its Adopter read of the
// next request, which fasthttp reads first (a copy); until that request is
// read, no read deadline fasthttp sets goes past by (--read-timeout from
// when the Adopter began to read it: fasthttp's own would count from its
// first read).
func (c *Conn) Replay(in []byte, by time.Time) {
	c.readBy.Store(by.UnixNano())
	c.replay = append([]byte(nil), in...)
}

// Linger makes Close linger: an error answer goes to a request that may
// not have been read whole.
func (c *Conn) Linger() { c.linger.Store(true) }

// NextAdopter is the Adopter c goes to for its next request, once an
// event loop finished its answer (nil: it has none).
func (c *Conn) NextAdopter() Adopter { return c.adopter }

// Counted adds the request of rc to the bytes its connection's requests
// took, and marks the connection busy until the returned func is called
// (when the handler returns): reads meanwhile (a Watch's) are no request
// boundary.
func Counted(rc *fasthttp.RequestCtx) func() {
	c, ok := rc.Conn().(*Conn)
	if !ok {
		return func() {}
	}
	c.readBy.Store(0) // the request is read
	c.count(&rc.Request.Header)
	c.busy.Store(true)
	return c.idle
}

func (c *Conn) idle() { c.busy.Store(false) }

// Hold marks rc's client connection busy again until the returned func is
// called, for a Watch that reads it after the handler returned (a body
// stream that waits on an upstream between its writes): such a read is no
// request boundary, so it must not hand the connection to the Adopter
// (Read's io.EOF), which the watch would take for the client leaving.
func Hold(rc *fasthttp.RequestCtx) func() {
	c, ok := rc.Conn().(*Conn)
	if !ok {
		return func() {}
	}
	c.busy.Store(true)
	return c.idle
}

// Listener accepts Conns.
type Listener struct {
	net.Listener
	Adopter Adopter   // nil: none
	Tails   *TailPool // nil: the byte counts are not kept exact (no event loops)
}

// Accept implements net.Listener.
func (l Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		return &Conn{TCPConn: tc, adopter: l.Adopter, tails: l.Tails}, nil
	}
	return c, nil
}
