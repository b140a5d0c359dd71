package sse

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestRewrite(t *testing.T) {
	ev := []byte("event: e\ndata: {\"n\":1}\n\n")
	out := Rewrite(nil, ev, func(d []byte) []byte { return bytes.ReplaceAll(d, []byte("1"), []byte("2")) })
	assert.Equal(t, "event: e\ndata: {\"n\":2}\n\n", string(out))
	assert.Equal(t, string(ev), string(Rewrite(nil, ev, nil)))
}

// TestRewriteJoinsDataLines: the data lines of one event are one payload
// to a client (joined with '\n'), so fn gets them joined, and its result
// is written back as data lines where the first was; an event of one data
// line is rewritten line by line as before.
func TestRewriteJoinsDataLines(t *testing.T) {
	for _, tc := range []struct{ name, in, payload, want string }{
		{"one data line after an event line", "event: e\ndata: {\"a\":1}\n\n", `{"a":1}`, "event: e\ndata: {\"A\":1}\n\n"},
		{"two data lines", "data: {\"a\":\ndata: 1}\n\n", "{\"a\":\n1}", "data: {\"A\":\ndata: 1}\n\n"},
		{"two events, one data line each (a held preamble)", "data: {\"a\":1}\n\ndata: {\"b\":2}\n\n", "", "data: {\"A\":1}\n\ndata: {\"B\":2}\n\n"},
		{"a line between, CRLF", "data: [1,\r\nid: 7\r\ndata:2]\r\n\r\n", "[1,\n2]", "data: [1,\ndata: 2]\nid: 7\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var seen []string
			out := Rewrite(nil, []byte(tc.in), func(d []byte) []byte {
				seen = append(seen, string(d))
				return bytes.ToUpper(d)
			})
			if tc.payload != "" {
				assert.Equal(t, []string{tc.payload}, seen, "fn gets the payload a client reads")
			}
			assert.Equal(t, tc.want, string(out))
		})
	}
}

func TestErrorEvent(t *testing.T) {
	assert.Equal(t, "data: {\"error\":{}}\n\ndata: [DONE]\n\n", string(ErrorEvent([]byte(`{"error":{}}`))))
}

func TestBound(t *testing.T) {
	for _, tc := range []struct{ n, want int }{
		{0, DefaultMaxEventBytes}, {-1, DefaultMaxEventBytes}, {1, 1}, {16 << 10, 16 << 10},
	} {
		assert.Equal(t, tc.want, Bound(tc.n), "Bound(%d)", tc.n)
	}
}
