package sse

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
)

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
		er := NewReader(bytes.NewReader(in), nil, 0)
		var out []byte
		n := 0
		for {
			ev, err := er.Next()
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
			out = Rewrite(out[:0], ev, fn)
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
			if d := FirstData(ev); d != nil && connectors.IsObject(d) && json.Valid(d) {
				if got := FirstData(out); !json.Valid(got) {
					t.Fatalf("rewrite broke valid JSON: %q -> %q", d, got)
				}
			}
		}
	})
}

// splitEventsReference is the SSE event split the Reader must agree with
// (the event loop's splitter, sserelay.Stream, is held to a copy of it),
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
		if line[len(line)-1] == '\n' && IsBlank(line) {
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
		return DefaultMaxEventBytes
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
	long := strings.Repeat("x", 3*readerSize)
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
		er := NewReader(r, nil, limit)
		refusals := 0
		er.Refused = func() { refusals++ }
		defer er.Release()
		var got [][]byte
		var end error
		for {
			ev, err := er.Next()
			if err != nil {
				end = err
				break
			}
			got = append(got, bytes.Clone(ev))
			require.LessOrEqual(t, len(got), len(in)+1, "more events than bytes")
		}
		_, err := er.Next()
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
