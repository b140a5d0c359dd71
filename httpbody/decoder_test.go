package httpbody

import (
	"bytes"
	"errors"
	"io"
	"net/http/httputil"
	"testing"
)

// decodeAll feeds in to d in pieces of step bytes, taking at most max
// payload bytes per call, and returns the payload and the bytes consumed.
func decodeAll(d *Decoder, in []byte, step, max int) ([]byte, int, error) {
	var out []byte
	total := 0
	for off := 0; off < len(in); off += step {
		piece := in[off:min(off+step, len(in))]
		for len(piece) > 0 && !d.Done() {
			data, n, err := d.Next(piece, max)
			if err != nil {
				return out, total, err
			}
			out = append(out, data...)
			total += n
			piece = piece[n:]
			if n == 0 {
				break
			}
		}
		if d.Done() {
			break
		}
	}
	return out, total, nil
}

func TestDecoder(t *testing.T) {
	tests := []struct {
		name     string
		mode     Mode
		length   int64
		in       string
		want     string
		consumed int // of in; -1: all of it
		done     bool
		err      bool
	}{
		{name: "chunks", in: "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", want: "hello world", consumed: -1, done: true},
		{name: "upper hex and extension", in: "A;name=v\r\n0123456789\r\n0\r\n\r\n", want: "0123456789", consumed: -1, done: true},
		{name: "bare LF", in: "3\nabc\n0\n\n", want: "abc", consumed: -1, done: true},
		{name: "trailer", in: "3\r\nabc\r\n0\r\nX-T: 1\r\nY: 2\r\n\r\n", want: "abc", consumed: -1, done: true},
		{name: "next answer left alone", in: "1\r\na\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n", want: "a", consumed: 11, done: true},
		{name: "unfinished", in: "5\r\nhel", want: "hel", consumed: -1},
		{name: "no size", in: "\r\n", err: true},
		{name: "bad size byte", in: "5x\r\nhello\r\n", err: true},
		{name: "size too long", in: "1000000000000000\r\n", err: true},
		{name: "payload without CRLF", in: "1\r\nab\r\n", err: true},
		{name: "length", mode: Length, length: 4, in: "abcdef", want: "abcd", consumed: 4, done: true},
		{name: "empty length", mode: Length, length: 0, in: "x", want: "", consumed: 0, done: true},
		{name: "until close", mode: UntilClose, in: "0\r\n\r\nanything", want: "0\r\n\r\nanything", consumed: -1},
	}
	for _, tc := range tests {
		for _, step := range []int{1, 2, 3, 7, 1 << 20} {
			for _, max := range []int{1, 3, 1 << 20} {
				d := New(tc.mode, tc.length)
				got, n, err := decodeAll(&d, []byte(tc.in), step, max)
				if tc.err {
					if !errors.Is(err, ErrMalformed) {
						t.Errorf("%s step %d max %d: err %v, want ErrMalformed", tc.name, step, max, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s step %d max %d: %v", tc.name, step, max, err)
				}
				want := tc.consumed
				if want < 0 {
					want = len(tc.in)
				}
				if string(got) != tc.want || n != want || d.Done() != tc.done {
					t.Errorf("%s step %d max %d: got %q consumed %d done %v, want %q %d %v",
						tc.name, step, max, got, n, d.Done(), tc.want, want, tc.done)
				}
			}
		}
	}
}

func TestAppendChunk(t *testing.T) {
	var b []byte
	b = AppendChunk(b, []byte("hello"))
	b = AppendChunk(b, nil)
	b = AppendChunk(b, bytes.Repeat([]byte("x"), 300))
	var mark int
	b, mark = BeginChunk(b)
	b = EndChunk(b, mark) // empty: nothing
	b, mark = BeginChunk(b)
	b = append(b, "in place"...)
	b = EndChunk(b, mark)
	b = append(b, LastChunk...)
	got, err := io.ReadAll(httputil.NewChunkedReader(bytes.NewReader(b)))
	if err != nil || string(got) != "hello"+string(bytes.Repeat([]byte("x"), 300))+"in place" {
		t.Fatalf("round trip through net/http's chunked reader: %q, %v", got, err)
	}
	d := New(Chunked, 0)
	got2, n, err := decodeAll(&d, b, 5, 64)
	if err != nil || !bytes.Equal(got2, got) || n != len(b) || !d.Done() {
		t.Fatalf("own decoder: %d bytes consumed of %d, done %v, err %v", n, len(b), d.Done(), err)
	}
}

// FuzzDecoderChunked checks the decoder against net/http's chunked reader:
// on any body that reader decodes, the payload is the same however the body
// is split into reads.
func FuzzDecoderChunked(f *testing.F) {
	f.Add([]byte("5\r\nhello\r\n0\r\n\r\n"), uint8(1))
	f.Add([]byte("a;x=y\r\n0123456789\r\n3\r\nabc\r\n0\r\n\r\n"), uint8(3))
	f.Add([]byte("1\r\n\n\r\n0\r\n\r\n"), uint8(2))
	f.Fuzz(func(t *testing.T, in []byte, step uint8) {
		want, werr := io.ReadAll(httputil.NewChunkedReader(bytes.NewReader(in)))
		d := New(Chunked, 0)
		got, _, err := decodeAll(&d, in, int(step)+1, 7)
		if werr != nil {
			return // net/http refuses it; ours may be laxer (bare LF)
		}
		// net/http's reader stops at the last chunk and leaves the trailer;
		// ours reads (and checks) the trailer too.
		if err != nil && !d.inTrailer() {
			t.Fatalf("net/http decodes %q to %q; ours fails: %v", in, want, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%q: got %q, net/http %q", in, got, want)
		}
	})
}
