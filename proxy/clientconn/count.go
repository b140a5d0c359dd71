package clientconn

import (
	"bytes"
	"sync"

	"github.com/valyala/fasthttp"
)

// count adds the request with head h, which fasthttp read from the
// connection, to consumed, and begins measuring the request line of a
// request read ahead of it.
func (c *Conn) count(h *fasthttp.RequestHeader) {
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
func (c *Conn) lose() {
	c.lost.Store(true)
	c.putTail()
}

// putTail gives tail back to the pool: it is kept only from a read to the
// count of the last request the read holds.
func (c *Conn) putTail() {
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

// TailPool lends the copies of the ends of reads (Conn.tail); size is
// fasthttp's read buffer (--max-header-bytes), the most it reads ahead.
type TailPool struct {
	size int
	pool sync.Pool
}

// NewTailPool returns a TailPool for a read buffer of size bytes.
func NewTailPool(size int) *TailPool { return &TailPool{size: size} }

func (t *TailPool) get() []byte {
	if b, ok := t.pool.Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return make([]byte, 0, t.size)
}

func (t *TailPool) put(b []byte) { t.pool.Put(&b) }
