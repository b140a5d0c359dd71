package sserelay

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/httpbody"
	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
)

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
		return sse.DefaultMaxEventBytes
	}
	return int(b)
}

// FuzzLoopStreamSplits checks the event loop's incremental splitter
// (Stream) against the reference split: the body framed as chunks of one
// size, read in pieces of another, gives the same events in the same bytes;
// an event past the bound ends it with sse.ErrEventTooLong after the same
// events, as the goroutine path's reader does (FuzzEventReaderSplits).
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
		s := &Stream{Body: httpbody.New(httpbody.Chunked, 0), MaxEvent: limit}
		want, refused := splitEventsReference(in, limit)
		var out []byte
		for rest := framed; len(rest) > 0; {
			n := min(len(rest), int(piece)+1)
			var err error
			out, err = s.FeedRaw(out, rest[:n])
			if err != nil {
				require.ErrorIs(t, err, sse.ErrEventTooLong)
				require.True(t, refused, "%q refused at %d", in, limit)
				require.Empty(t, s.partial, "nothing of the long event kept")
				require.Equal(t, string(bytes.Join(want, nil)), string(out), "events of %q before the long one", in)
				return
			}
			rest = rest[n:]
		}
		require.False(t, refused, "%q not refused at %d", in, limit)
		require.True(t, s.Body.Done())
		out = s.FlushPartial(out)
		require.Equal(t, string(bytes.Join(want, nil)), string(out), "events of %q", in)
	})
}

// deadlineAt reads src but fails with a passed read deadline once, when
// the read would go past byte k (as the upstream connection does when a
// stream is about to move to an event loop); reads resume after it.
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
				s := &Stream{}
				var out []byte
				for _, b := range er.Unread() {
					out, err = s.Feed(out, b)
					require.NoError(t, err)
				}
				rest := in[min(int(k), len(in)):]
				if len(in) > int(k) {
					// What the reader has not read yet: all bytes from k on.
					out, err = s.Feed(out, rest)
					require.NoError(t, err)
				}
				got = append(got, s.FlushPartial(out)...)
				break
			}
			if err != nil {
				require.ErrorIs(t, err, io.EOF)
				break
			}
			got = append(got, ev...)
		}
		evs, _ := splitEventsReference(in, sse.DefaultMaxEventBytes)
		want := bytes.Join(evs, nil)
		require.Equal(t, string(want), string(got), "events of %q, stopped at %d", in, k)
	})
}
