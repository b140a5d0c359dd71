package sserelay

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/httpbody"
	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
)

// readAllEvents reads every event of er, and the error that ended it.
func readAllEvents(er *sse.Reader) ([]string, error) {
	var evs []string
	for {
		ev, err := er.Next()
		if err != nil {
			return evs, err
		}
		evs = append(evs, string(ev))
	}
}

// loopEvents feeds in to a Stream bounded at limit, framed chunked and in
// pieces of piece bytes, and returns what it relayed and the error that
// ended it (nil: the body's end).
func loopEvents(in string, limit, piece int) (string, error) {
	framed := append(httpbody.AppendChunk(nil, []byte(in)), httpbody.LastChunk...)
	s := &Stream{Body: httpbody.New(httpbody.Chunked, 0), MaxEvent: limit}
	var out []byte
	for rest := framed; len(rest) > 0; {
		n := min(len(rest), piece)
		var err error
		if out, err = s.FeedRaw(out, rest[:n]); err != nil {
			return string(out), err
		}
		rest = rest[n:]
	}
	return string(s.FlushPartial(out)), nil
}

// TestEventBoundBothReaders: the goroutine path's reader (sse.Reader) and
// the event loop's (Stream) cut the same events and refuse the same event, at the same bound
// (FuzzEventReaderSplits and FuzzLoopStreamSplits hold them to the
// reference on arbitrary input).
func TestEventBoundBothReaders(t *testing.T) {
	const limit = 32
	ev := func(n int) string { return "data: " + strings.Repeat("a", n-8) + "\n\n" } // n bytes in all
	for _, tc := range []struct {
		name    string
		in      string
		events  []string
		refused bool
	}{
		{name: "an event of the bound", in: ev(limit) + ev(10), events: []string{ev(limit), ev(10)}},
		{name: "an event a byte past it", in: ev(10) + ev(limit+1) + ev(10), events: []string{ev(10)}, refused: true},
		{name: "a line that never ends", in: ev(10) + "data: {\"choices\":[{\"text\":\"" + strings.Repeat("a", 1000), events: []string{ev(10)}, refused: true},
		{name: "a final event of the bound without its blank line", in: "data: " + strings.Repeat("a", limit-6),
			events: []string{"data: " + strings.Repeat("a", limit-6) + "\n\n"}},
		{name: "a final event past it", in: "data: " + strings.Repeat("a", limit-5), refused: true},
		{name: "blank lines between events do not count", in: ev(limit) + strings.Repeat("\n", 100) + ev(limit),
			events: []string{ev(limit), ev(limit)}},
		{name: "CRLF lines", in: "data: " + strings.Repeat("a", limit-10) + "\r\n\r\n", events: []string{"data: " + strings.Repeat("a", limit-10) + "\r\n\r\n"}},
		{name: "blank-only lines count as they come", in: strings.Repeat(" \n", limit) + "\n" + ev(10), refused: true},
		{name: "many lines in one event", in: strings.Repeat("data: a\n", 5) + "\n", refused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, how := range []string{"whole", "a byte at a time"} {
				var r io.Reader = strings.NewReader(tc.in)
				if how != "whole" {
					r = iotest.OneByteReader(r)
				}
				er := sse.NewReader(r, nil, limit)
				refusals := 0
				er.Refused = func() { refusals++ }
				evs, err := readAllEvents(er)
				assert.Equal(t, tc.events, evs, "the reader's events (%s)", how)
				if tc.refused {
					assert.ErrorIs(t, err, sse.ErrEventTooLong, how)
					assert.Equal(t, 1, refusals, how)
					_, again := er.Next()
					assert.ErrorIs(t, again, sse.ErrEventTooLong, "sticky (%s)", how)
					assert.Equal(t, 1, refusals, "counted once (%s)", how)
				} else {
					assert.ErrorIs(t, err, io.EOF, how)
					assert.Zero(t, refusals, how)
				}
			}
			for _, piece := range []int{1, 7, 4096} {
				out, err := loopEvents(tc.in, limit, piece)
				assert.Equal(t, strings.Join(tc.events, ""), out, "the loop's events (pieces of %d)", piece)
				if tc.refused {
					assert.ErrorIs(t, err, sse.ErrEventTooLong, "pieces of %d", piece)
				} else {
					assert.NoError(t, err, "pieces of %d", piece)
				}
			}
		})
	}
}

// endless is an SSE body whose second event never ends: an event, then
// `data: {"choices":[{"text":"aaaa…` forever. It counts what was read.
type endless struct {
	head []byte
	read int
}

func (e *endless) Read(p []byte) (int, error) {
	n := 0
	if len(e.head) > 0 {
		n = copy(p, e.head)
		e.head = e.head[n:]
	}
	for i := n; i < len(p); i++ {
		p[i] = 'a'
	}
	e.read += len(p)
	return len(p), nil
}

func newEndless() *endless {
	return &endless{head: []byte("data: {\"choices\":[{\"text\":\"x\"}]}\n\ndata: {\"choices\":[{\"text\":\"")}
}

// TestEventBoundEndlessLine: an upstream that never ends an event is fed
// to the event loop's reader no further than the bound (and a read), and
// nothing of the event is kept once it is refused (sse.Reader's own test,
// TestReaderEndlessLine, holds the goroutine path's reader to the same).
func TestEventBoundEndlessLine(t *testing.T) {
	const limit = sse.DefaultMaxEventBytes
	src := newEndless()
	s := &Stream{Body: httpbody.New(httpbody.UntilClose, 0)}
	piece := make([]byte, 16<<10)
	var out []byte
	var err error
	for err == nil && src.read < 64*limit {
		n, _ := src.Read(piece)
		out, err = s.FeedRaw(out, piece[:n])
	}
	require.ErrorIs(t, err, sse.ErrEventTooLong)
	assert.Equal(t, "data: {\"choices\":[{\"text\":\"x\"}]}\n\n", string(out))
	assert.LessOrEqual(t, src.read, limit+len(piece), "fed up to the bound, not further")
	assert.Nil(t, s.partial, "the refused event's bytes let go")
}
