package sse

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReader(t *testing.T) {
	in := "data: {\"a\":1}\n\n\n: comment\n\nevent: x\r\ndata: {\"b\":2}\r\n\r\ndata: [DONE]"
	er := NewReader(strings.NewReader(in), nil, 0)
	var got []string
	for {
		ev, err := er.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		got = append(got, string(ev))
	}
	assert.Equal(t, []string{
		"data: {\"a\":1}\n\n",
		": comment\n\n",
		"event: x\r\ndata: {\"b\":2}\r\n\r\n",
		"data: [DONE]\n\n",
	}, got)
	assert.Equal(t, `{"b":2}`, string(FirstData([]byte(got[2]))))
	assert.Nil(t, FirstData([]byte(got[1])))
}

func TestReaderLongLine(t *testing.T) {
	long := "data: " + strings.Repeat("x", 100<<10) + "\n\n"
	ev, err := NewReader(strings.NewReader(long), nil, 0).Next()
	require.NoError(t, err)
	assert.Equal(t, long, string(ev))
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

// TestReaderEndlessLine: an upstream that never ends an event is read no
// further than the bound (and a read buffer), and nothing of the event is
// kept once it is refused.
func TestReaderEndlessLine(t *testing.T) {
	src := &endless{head: []byte("data: {\"choices\":[{\"text\":\"x\"}]}\n\ndata: {\"choices\":[{\"text\":\"")}
	er := NewReader(src, nil, 0) // 0: the default bound
	ev, err := er.Next()
	require.NoError(t, err)
	assert.Equal(t, "data: {\"choices\":[{\"text\":\"x\"}]}\n\n", string(ev))
	_, err = er.Next()
	require.ErrorIs(t, err, ErrEventTooLong)
	assert.LessOrEqual(t, src.read, DefaultMaxEventBytes+2*readerSize, "read up to the bound, not further")
	assert.Nil(t, er.buf, "the refused event's bytes let go")
}

// TestReaderLongHook: the hook that watches the client (Reader.Long) runs
// only while an event longer than the read buffer is assembled, and is
// stopped each time the assembly stops.
func TestReaderLongHook(t *testing.T) {
	short := "data: " + strings.Repeat("s", 100) + "\n\n"
	long := "data: " + strings.Repeat("l", 3*readerSize) + "\n\n"
	er := NewReader(strings.NewReader(short+long+short), nil, 0)
	armed, stopped := 0, 0
	er.Long = func() func() {
		armed++
		return func() { stopped++ }
	}
	for i, want := range []string{short, long, short} {
		ev, err := er.Next()
		require.NoError(t, err)
		require.Equal(t, want, string(ev), "event %d", i)
		wantArmed := 0
		if i >= 1 {
			wantArmed = 1
		}
		assert.Equal(t, wantArmed, armed, "armed after event %d", i)
		assert.Equal(t, armed, stopped, "stopped after event %d", i)
	}
	_, err := er.Next()
	assert.True(t, errors.Is(err, io.EOF))
}

// TestReaderDropsLongBuffer: an assembled long event's buffer is not kept
// for the rest of the stream.
func TestReaderDropsLongBuffer(t *testing.T) {
	long := "data: " + strings.Repeat("l", 2*MaxPooledChunk) + "\n\n"
	er := NewReader(strings.NewReader(long+"data: b\n\n"), nil, 0)
	ev, err := er.Next()
	require.NoError(t, err)
	require.Equal(t, long, string(ev))
	ev, err = er.Next()
	require.NoError(t, err)
	assert.Equal(t, "data: b\n\n", string(ev))
	assert.LessOrEqual(t, cap(er.buf), MaxPooledChunk)
}

// aheadReader is a stream whose bytes received below it are ahead (as an
// upstream leg's connection buffer is).
type aheadReader struct {
	io.Reader
	ahead string
}

func (a *aheadReader) Ahead() []byte { return []byte(a.ahead) }

// TestReaderPending: a complete event is pending when it is buffered, or
// (on a stream that shows them) among the bytes received below the reader.
func TestReaderPending(t *testing.T) {
	for _, tc := range []struct {
		name   string
		in     io.Reader
		reads  int
		expect bool
	}{
		{name: "another event buffered", in: strings.NewReader("data: a\n\ndata: b\n\n"), reads: 1, expect: true},
		{name: "a CRLF event buffered", in: strings.NewReader("data: a\r\n\r\ndata: b\r\n\r\n"), reads: 1, expect: true},
		{name: "nothing more", in: strings.NewReader("data: a\n\ndata: b"), reads: 1},
		{name: "an event ahead", in: &aheadReader{Reader: strings.NewReader("data: a\n\n"), ahead: "data: b\n\n"}, reads: 1, expect: true},
		{name: "part of one ahead", in: &aheadReader{Reader: strings.NewReader("data: a\n\n"), ahead: "data: b\n"}, reads: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bufs := &Bufs{}
			er := NewReader(tc.in, bufs, 0)
			defer er.Release()
			for range tc.reads {
				_, err := er.Next()
				require.NoError(t, err)
			}
			assert.Equal(t, tc.expect, er.Pending())
		})
	}
}
