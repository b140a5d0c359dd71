package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tidwall/sjson"

	"github.com/pd-sidecar/pd-sidecar/httpbody"
	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
	"github.com/pd-sidecar/pd-sidecar/ssrf"
)

// FuzzPickPrefiller: the header parser never panics, returns either a
// valid host:port or ErrBadPrefiller, and the allowlists agree with it.
func FuzzPickPrefiller(f *testing.F) {
	for _, s := range []string{"10.0.0.1:8000", " 10.0.0.1:8000 , 10.0.0.2:8000", "[::1]:80", "host", ":80", "a:0", "a:99999",
		",,", "[fe80::1%eth0]:1", "10.0.0.1:8000,", strings.Repeat("a", 300) + ":1"} {
		f.Add([]byte(s), false)
	}
	static, err := ssrf.ParseStatic([]string{"10.0.0.0/8", "*.svc:8000"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, v []byte, sampling bool) {
		hp, err := pickPrefiller(v, sampling)
		allowed := static.Allowed(hp)
		if err != nil {
			if !errors.Is(err, ErrBadPrefiller) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		host, _, serr := net.SplitHostPort(hp)
		if serr != nil || host == "" {
			t.Fatalf("accepted %q", hp)
		}
		if allowed && !strings.HasPrefix(hp, "10.") && !strings.Contains(hp, ".svc:") && !strings.HasPrefix(hp, "[::ffff:") {
			t.Fatalf("allowlist admitted %q", hp)
		}
	})
}

// FuzzSSEErrorEvent: the error event that ends a broken stream is valid
// JSON whatever the error text.
func FuzzSSEErrorEvent(f *testing.F) {
	f.Add("stream broke off", 502)
	f.Add("\"quoted\" \x00 \u2028 \xff", 500)
	f.Fuzz(func(t *testing.T, msg string, status int) {
		ev := sse.ErrorEvent(errorBody(status, errors.New(msg)))
		d := sse.FirstData(ev)
		if !json.Valid(d) {
			t.Fatalf("invalid error event %q", ev)
		}
		if b, _ := sjson.SetBytes(nil, "x", 1); len(b) == 0 {
			t.Fatal("sjson")
		}
	})
}

// splitEventsReference is the SSE event split the readers must agree with
// (sse.Reader is held to a copy of it in its own package), written the
// plain way: lines up to and including their '\n'; an event
// ends at a blank line; blank-only events are skipped; a final event
// without its blank line gets one. An event (or blank-only run) longer than
// limit bytes ends the split: the events before it, and refused.
func splitEventsReference(in []byte, limit int) (evs [][]byte, refused bool) {
	var cur []byte
	for len(in) > 0 {
		line := in
		if i := bytes.IndexByte(in, '\n'); i >= 0 {
			line, in = in[:i+1], in[i+1:]
		} else {
			in = nil
		}
		cur = append(cur, line...)
		if len(cur) > limit {
			return evs, true
		}
		if line[len(line)-1] == '\n' && sse.IsBlank(line) {
			if len(bytes.TrimSpace(cur)) > 0 {
				evs = append(evs, cur)
			}
			cur = nil
		}
	}
	if len(bytes.TrimSpace(cur)) > 0 {
		evs = append(evs, append(cur, "\n\n"...))
	}
	return evs, false
}

// fuzzBound is a fuzz input's event bound: 1 to 255 bytes, or (0) the
// default.
func fuzzBound(b uint8) int {
	if b == 0 {
		return DefaultMaxSSEEventBytes
	}
	return int(b)
}

// FuzzLoopStreamSplits checks the event loop's incremental splitter against
// the reference split: the body framed as chunks of one size, read in
// pieces of another, gives the same events in the same bytes; an event past
// the bound ends it with ErrEventTooLong after the same events, as the
// goroutine path's reader does (FuzzEventReaderSplits).
func FuzzLoopStreamSplits(f *testing.F) {
	for _, s := range []string{
		"data: a\n\ndata: b\n\n", "data: a\r\n\r\ndata: b\r\n\r\n", "\n\n\ndata: a\n\n  \n\n",
		"data: " + strings.Repeat("x", 5000) + "\n\ndata: b\n\n", "data: tail without blank line",
		": c\n\nevent: x\ndata: y\n\n", "data: a\r\n\r", "  \n  \n  \n\ndata: b\n\n",
	} {
		for _, bound := range []uint8{0, 8, 9, 10, 200} {
			f.Add([]byte(s), uint8(1), uint8(1), bound)
			f.Add([]byte(s), uint8(3), uint8(7), bound)
			f.Add([]byte(s), uint8(200), uint8(2), bound)
		}
	}
	f.Fuzz(func(t *testing.T, in []byte, chunk, piece, bound uint8) {
		var framed []byte
		for rest := in; len(rest) > 0; {
			n := min(len(rest), int(chunk)+1)
			framed = httpbody.AppendChunk(framed, rest[:n])
			rest = rest[n:]
		}
		framed = append(framed, httpbody.LastChunk...)
		limit := fuzzBound(bound)
		ls := &loopStream{body: httpbody.New(httpbody.Chunked, 0), maxEvent: limit}
		want, refused := splitEventsReference(in, limit)
		var out []byte
		for rest := framed; len(rest) > 0; {
			n := min(len(rest), int(piece)+1)
			var err error
			out, err = ls.feedRaw(out, rest[:n])
			if err != nil {
				require.ErrorIs(t, err, ErrEventTooLong)
				require.True(t, refused, "%q refused at %d", in, limit)
				require.Empty(t, ls.partial, "nothing of the long event kept")
				require.Equal(t, string(bytes.Join(want, nil)), string(out), "events of %q before the long one", in)
				return
			}
			rest = rest[n:]
		}
		require.False(t, refused, "%q not refused at %d", in, limit)
		require.True(t, ls.body.Done())
		out = ls.flushPartial(out)
		require.Equal(t, string(bytes.Join(want, nil)), string(out), "events of %q", in)
	})
}

// deadlineAt reads src but fails with a passed read deadline once, when
// the read would go past byte k (as the upstream connection does when a
// stream has run loopAfter); reads resume after it.
type deadlineAt struct {
	src  []byte
	k    int
	off  int
	done bool
}

func (d *deadlineAt) Read(p []byte) (int, error) {
	if d.off >= len(d.src) {
		return 0, io.EOF
	}
	end := len(d.src)
	if !d.done {
		if d.off >= d.k {
			d.done = true
			return 0, os.ErrDeadlineExceeded
		}
		end = min(d.k, len(d.src))
	}
	n := copy(p, d.src[d.off:end])
	d.off += n
	return n, nil
}

// FuzzHandOverAnywhere stops the goroutine path's event reader at an
// arbitrary byte with a read deadline, as a stream moving to an event loop
// does, and checks that what it returned, plus what the loop makes of its
// unread bytes and of the rest, is exactly the reference split. It also
// checks that a reader that stays (a refused hand-over) resumes intact.
func FuzzHandOverAnywhere(f *testing.F) {
	long := strings.Repeat("y", 3<<10) // longer than a Reader's read buffer
	for _, s := range []string{
		"data: a\n\ndata: b\n\n", "data: " + long + "\n\ndata: b\n\n", "data: a\r\n\r\ndata: " + long + "\r\n\r\n",
		"\n\ndata: tail without blank line", ": c\n\nevent: x\ndata: y\n\n",
	} {
		for _, k := range []uint16{0, 3, 9, 1500, 3100} {
			f.Add([]byte(s), k, false)
			f.Add([]byte(s), k, true)
		}
	}
	f.Fuzz(func(t *testing.T, in []byte, k uint16, stay bool) {
		er := sse.NewReader(&deadlineAt{src: in, k: int(k)}, nil, 0)
		defer er.Release()
		var got []byte
		for {
			ev, err := er.Next()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				if stay {
					continue // the reader resumes where it stopped
				}
				ls := &loopStream{}
				var out []byte
				for _, b := range er.Unread() {
					out, err = ls.feed(out, b)
					require.NoError(t, err)
				}
				rest := in[min(int(k), len(in)):]
				if len(in) > int(k) {
					// What the reader has not read yet: all bytes from k on.
					out, err = ls.feed(out, rest)
					require.NoError(t, err)
				}
				got = append(got, ls.flushPartial(out)...)
				break
			}
			if err != nil {
				require.ErrorIs(t, err, io.EOF)
				break
			}
			got = append(got, ev...)
		}
		evs, _ := splitEventsReference(in, DefaultMaxSSEEventBytes)
		want := bytes.Join(evs, nil)
		require.Equal(t, string(want), string(got), "events of %q, stopped at %d", in, k)
	})
}
