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
