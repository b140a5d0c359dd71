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
	"testing/iotest"

	"github.com/stretchr/testify/require"
	"github.com/tidwall/sjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/httpbody"
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

// FuzzSSEScanRewrite splits arbitrary upstream bytes into events and
// rewrites them with the cached-token rewriter: no panic, no byte lost
// outside data payloads, and every rewritten JSON payload stays valid JSON.
func FuzzSSEScanRewrite(f *testing.F) {
	for _, s := range []string{
		"data: {\"choices\":[{\"text\":\"a\"}],\"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":9}}}\n\ndata: [DONE]\n\n",
		": comment\r\n\r\ndata: {\"a\":1}\r\n\r\n",
		"event: x\ndata: {\"error\":{\"code\":500}}\n\n\n\ndata: [DONE]",
		"data:\n\n", "\n\n\n", "data: {\"usage\":null}\n\n",
	} {
		f.Add([]byte(s), uint8(0))
	}
	rw := nixlv2.New()
	h := connectors.Handoff{CachedTokens: 3}
	apis := []connectors.API{connectors.APICompletions, connectors.APIChat, connectors.APIResponses, connectors.APIMessages}
	f.Fuzz(func(t *testing.T, in []byte, apiSel uint8) {
		api := apis[int(apiSel)%len(apis)]
		fn := func(d []byte) []byte { return rw.RewriteAnswer(api, d, h) }
		er := newEventReader(bytes.NewReader(in), nil, 0)
		var out []byte
		n := 0
		for {
			ev, err := er.next()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					t.Fatalf("reader error %v", err)
				}
				break
			}
			n++
			if n > len(in)+1 {
				t.Fatal("more events than bytes")
			}
			out = rewriteEvent(out[:0], ev, fn)
			for _, line := range bytes.Split(out, []byte("\n")) {
				d, ok := bytes.CutPrefix(line, []byte("data: "))
				if !ok {
					continue
				}
				if connectors.IsObject(d) && json.Valid(d) {
					continue
				}
				// A payload that was not valid JSON is passed on unchanged.
				if json.Valid(d) && connectors.IsObject(d) != connectors.IsObject(bytes.TrimSpace(d)) {
					t.Fatalf("payload damaged: %q", d)
				}
			}
			if d := firstData(ev); d != nil && connectors.IsObject(d) && json.Valid(d) {
				if got := firstData(out); !json.Valid(got) {
					t.Fatalf("rewrite broke valid JSON: %q -> %q", d, got)
				}
			}
		}
	})
}

// FuzzSSEErrorEvent: the error event that ends a broken stream is valid
// JSON whatever the error text.
func FuzzSSEErrorEvent(f *testing.F) {
	f.Add("stream broke off", 502)
	f.Add("\"quoted\" \x00 \u2028 \xff", 500)
	f.Fuzz(func(t *testing.T, msg string, status int) {
		ev := sseError(status, errors.New(msg))
		d := firstData(ev)
		if !json.Valid(d) {
			t.Fatalf("invalid error event %q", ev)
		}
		if b, _ := sjson.SetBytes(nil, "x", 1); len(b) == 0 {
			t.Fatal("sjson")
		}
	})
}

// splitEventsReference is the SSE event split the readers must agree with,
// written the plain way: lines up to and including their '\n'; an event
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
		if line[len(line)-1] == '\n' && isBlank(line) {
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

// FuzzEventReaderSplits: whatever the input and however it arrives (whole,
// a byte at a time, in halves), the event reader — zero-copy when an event
// is whole in its buffer, assembled across refills when not — returns the
// reference split, then io.EOF, and io.EOF again; or, at an event past its
// bound, the events before it, then ErrEventTooLong, sticky, reported
// once.
func FuzzEventReaderSplits(f *testing.F) {
	long := strings.Repeat("x", 3*eventReaderSize)
	for _, s := range []string{
		"data: a\n\ndata: b\n\n", "data: a\r\n\r\ndata: b\r\n\r\n", "\n\n\ndata: a\n\n  \n\n",
		"data: " + long + "\n\ndata: b\n\n", "data: tail without blank line", "data: a\n\ndata: b",
		": c\n\nevent: x\ndata: y\n\n", "data: a\n\n" + long, "  \n  \n  \n\ndata: b\n\n",
	} {
		for _, bound := range []uint8{0, 8, 9, 10, 200} {
			f.Add([]byte(s), uint8(0), bound)
			f.Add([]byte(s), uint8(1), bound)
			f.Add([]byte(s), uint8(2), bound)
		}
	}
	f.Fuzz(func(t *testing.T, in []byte, how, bound uint8) {
		var r io.Reader = bytes.NewReader(in)
		switch how % 3 {
		case 1:
			r = iotest.OneByteReader(r)
		case 2:
			r = iotest.HalfReader(r)
		}
		limit := fuzzBound(bound)
		er := newEventReader(r, nil, limit)
		refusals := 0
		er.refused = func() { refusals++ }
		defer er.release()
		var got [][]byte
		var end error
		for {
			ev, err := er.next()
			if err != nil {
				end = err
				break
			}
			got = append(got, bytes.Clone(ev))
			require.LessOrEqual(t, len(got), len(in)+1, "more events than bytes")
		}
		_, err := er.next()
		require.ErrorIs(t, err, end, "the end is sticky")
		want, refused := splitEventsReference(in, limit)
		if refused {
			require.ErrorIs(t, end, ErrEventTooLong, "%q bounded at %d", in, limit)
			require.Equal(t, 1, refusals, "a refusal reported once")
		} else {
			require.ErrorIs(t, end, io.EOF, "%q bounded at %d", in, limit)
			require.Zero(t, refusals)
		}
		require.Equal(t, len(want), len(got), "events of %q", in)
		for i := range want {
			require.Equal(t, string(want[i]), string(got[i]), "event %d of %q", i, in)
		}
	})
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
	long := strings.Repeat("y", 3*eventReaderSize)
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
		er := newEventReader(&deadlineAt{src: in, k: int(k)}, nil, 0)
		defer er.release()
		var got []byte
		for {
			ev, err := er.next()
			if errors.Is(err, os.ErrDeadlineExceeded) {
				if stay {
					continue // the reader resumes where it stopped
				}
				ls := &loopStream{}
				var out []byte
				for _, b := range er.unread() {
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
