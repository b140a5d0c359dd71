// Package httpbody decodes an HTTP/1.1 response body's framing (chunked,
// Content-Length, or read until close) incrementally and without copying:
// it is fed whatever bytes the connection gave and returns the payload
// found in them as sub-slices, keeping only a few integers of state
// between calls. So a reader can stop at any byte and hand the rest of the
// body (and the decoder) to someone else, which a blocking io.Reader, such
// as net/http's or fasthttp's, cannot do.
package httpbody

import (
	"errors"
	"fmt"
	"slices"
)

// ErrMalformed: the body's chunked framing is invalid.
var ErrMalformed = errors.New("malformed chunked body")

// maxChunkSize bounds a chunk's size (2^60 bytes; leading zeros in the
// size line are no limit).
const maxChunkSize = 1 << 60

type state uint8

const (
	stSize        state = iota // hex digits of a chunk size
	stSizeExt                  // a chunk extension, up to the line's end
	stSizeLF                   // the LF after the size line's CR
	stData                     // chunk payload
	stDataCR                   // the CRLF after a chunk's payload
	stDataLF                   // the LF of that CRLF
	stTrailer                  // the start of a trailer line (or the final empty line)
	stTrailerLine              // inside a trailer line
	stTrailerLF                // the LF of the final empty line
	stDone
)

// Mode is how a body is delimited.
type Mode uint8

// The body modes.
const (
	Chunked    Mode = iota // Transfer-Encoding: chunked
	Length                 // Content-Length bytes
	UntilClose             // the rest of the connection
)

// Decoder is the framing state of one body. The zero value decodes a
// chunked body.
type Decoder struct {
	mode   Mode
	st     state
	digits int   // of the size line so far
	size   int64 // of the chunk being read, or what is left of a Length body
	err    error
}

// New returns a decoder of a body delimited by mode; n is the Content-Length
// of a Length body.
func New(mode Mode, n int64) Decoder {
	d := Decoder{mode: mode}
	if mode == Length {
		d.size = n
		if n <= 0 {
			d.st = stDone
		}
	}
	return d
}

// Mode returns how the body is delimited.
func (d *Decoder) Mode() Mode { return d.mode }

// Done reports whether the whole body was decoded (never, for UntilClose:
// its end is the connection's).
func (d *Decoder) Done() bool { return d.st == stDone }

// Next decodes the front of in. It returns the payload found there (a
// sub-slice of in, at most max bytes), and how many bytes of in it consumed,
// framing included. Called in a loop until it consumes all of in or the body
// is done, it decodes everything in. Once the body is done it consumes
// nothing: the bytes after a body belong to the connection's next answer.
func (d *Decoder) Next(in []byte, max int) (data []byte, consumed int, err error) {
	if d.err != nil {
		return nil, 0, d.err
	}
	switch d.mode {
	case UntilClose:
		n := min(len(in), max)
		return in[:n], n, nil
	case Length:
		if d.st == stDone {
			return nil, 0, nil
		}
		n := int(min(int64(len(in)), int64(max), d.size))
		d.size -= int64(n)
		if d.size == 0 {
			d.st = stDone
		}
		return in[:n], n, nil
	}
	i := 0
	for i < len(in) {
		c := in[i]
		switch d.st {
		case stSize:
			v, ok := hexValue(c)
			switch {
			case ok:
				if d.size >= maxChunkSize>>4 {
					return d.fail("chunk size too large")
				}
				d.size = d.size<<4 | int64(v)
				d.digits++
			case d.digits == 0:
				return d.fail("chunk size expected") // never the byte: an error names no upstream bytes
			case c == ';' || c == ' ' || c == '\t':
				d.st = stSizeExt
			case c == '\r':
				d.st = stSizeLF
			case c == '\n':
				d.endSizeLine()
			default:
				return d.fail("bad byte in chunk size")
			}
			i++
		case stSizeExt:
			if c == '\n' {
				d.endSizeLine()
			}
			i++
		case stSizeLF:
			if c != '\n' {
				return d.fail("CR without LF after chunk size")
			}
			d.endSizeLine()
			i++
		case stData:
			n := int(min(int64(len(in)-i), int64(max), d.size))
			d.size -= int64(n)
			if d.size == 0 {
				d.st = stDataCR
			}
			return in[i : i+n], i + n, nil
		case stDataCR:
			switch c {
			case '\r':
				d.st = stDataLF
			case '\n':
				d.st = stSize
			default:
				return d.fail("chunk payload not followed by CRLF")
			}
			i++
		case stDataLF:
			if c != '\n' {
				return d.fail("chunk payload not followed by CRLF")
			}
			d.st = stSize
			i++
		case stTrailer:
			switch c {
			case '\r':
				d.st = stTrailerLF
			case '\n':
				d.st = stDone
				return nil, i + 1, nil
			default:
				d.st = stTrailerLine
			}
			i++
		case stTrailerLine:
			if c == '\n' {
				d.st = stTrailer
			}
			i++
		case stTrailerLF:
			if c != '\n' {
				return d.fail("CR without LF ending the trailer")
			}
			d.st = stDone
			return nil, i + 1, nil
		case stDone:
			return nil, i, nil
		}
	}
	return nil, i, nil
}

// inTrailer reports whether the last chunk was read (and its trailer is
// being read or failed).
func (d *Decoder) inTrailer() bool {
	return d.st == stTrailer || d.st == stTrailerLine || d.st == stTrailerLF
}

// endSizeLine moves past a chunk size line: to the payload, or to the
// trailer after the last chunk.
func (d *Decoder) endSizeLine() {
	d.digits = 0
	if d.size == 0 {
		d.st = stTrailer
		return
	}
	d.st = stData
}

func (d *Decoder) fail(why string) ([]byte, int, error) {
	d.err = fmt.Errorf("%w: %s", ErrMalformed, why)
	return nil, 0, d.err
}

func hexValue(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// AppendChunk appends data framed as one chunk (nothing for empty data,
// which would end the body).
func AppendChunk(dst, data []byte) []byte {
	if len(data) == 0 {
		return dst
	}
	dst = appendHex(dst, len(data))
	dst = append(dst, '\r', '\n')
	dst = append(dst, data...)
	return append(dst, '\r', '\n')
}

// chunkRoom is what BeginChunk reserves for a chunk's size line.
const chunkRoom = 16 + 2

// BeginChunk reserves room for a chunk's size line at the end of dst and
// returns dst and the chunk's start, for EndChunk once its data is
// appended: a chunk is built in place, without knowing its size first.
func BeginChunk(dst []byte) ([]byte, int) {
	mark := len(dst)
	dst = slices.Grow(dst, chunkRoom)
	return dst[:mark+chunkRoom], mark
}

// EndChunk frames the data appended since BeginChunk returned mark as one
// chunk (or removes the reserved room when there is none).
func EndChunk(dst []byte, mark int) []byte {
	data := len(dst) - mark - chunkRoom
	if data == 0 {
		return dst[:mark]
	}
	var h [chunkRoom]byte
	line := append(appendHex(h[:0], data), '\r', '\n')
	copy(dst[mark:], line)
	copy(dst[mark+len(line):], dst[mark+chunkRoom:])
	dst = dst[:len(dst)-(chunkRoom-len(line))]
	return append(dst, '\r', '\n')
}

// LastChunk ends a chunked body (no trailer).
const LastChunk = "0\r\n\r\n"

func appendHex(dst []byte, n int) []byte {
	const digits = "0123456789abcdef"
	var b [16]byte
	i := len(b)
	for {
		i--
		b[i] = digits[n&0xf]
		n >>= 4
		if n == 0 {
			break
		}
	}
	return append(dst, b[i:]...)
}
