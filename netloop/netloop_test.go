//go:build linux

package netloop

import (
	"bytes"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pair returns the two ends of a loopback TCP connection.
func pair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	b, err := ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a.(*net.TCPConn), b.(*net.TCPConn)
}

// recorder reads what is readable and reports every event.
type recorder struct {
	loop *Loop
	got  chan string
}

func (r *recorder) Ready(fd int, ev Events) {
	switch {
	case ev&Shutdown != 0:
		_ = r.loop.Remove(fd)
		r.got <- "shutdown"
	case ev&Readable != 0:
		in, _ := r.loop.Buffers()
		n, err := Read(fd, in)
		switch {
		case errors.Is(err, ErrWouldBlock):
		case n == 0:
			_ = r.loop.Remove(fd)
			r.got <- "eof"
		default:
			r.got <- string(in[:n])
		}
	case ev&HangUp != 0:
		_ = r.loop.Remove(fd)
		r.got <- "hangup"
	}
}

func next(t *testing.T, c chan string) string {
	t.Helper()
	select {
	case s := <-c:
		return s
	case <-time.After(5 * time.Second):
		t.Fatal("no event")
		return ""
	}
}

func TestLoopEvents(t *testing.T) {
	g, err := NewGroup(2)
	require.NoError(t, err)
	defer g.Close()

	t.Run("readable, then the peer closes", func(t *testing.T) {
		a, b := pair(t)
		fd, ok := FD(b)
		require.True(t, ok)
		l := g.Pick()
		r := &recorder{loop: l, got: make(chan string, 8)}
		require.NoError(t, l.Add(fd, Readable, r))
		require.Error(t, l.Add(fd, Readable, r), "an fd is watched once")
		_, err := a.Write([]byte("hello"))
		require.NoError(t, err)
		assert.Equal(t, "hello", next(t, r.got))
		require.NoError(t, a.Close())
		assert.Equal(t, "eof", next(t, r.got))
		assert.Zero(t, l.Len())
	})
	t.Run("hang-up without asking to read", func(t *testing.T) {
		a, b := pair(t)
		fd, _ := FD(b)
		l := g.Pick()
		r := &recorder{loop: l, got: make(chan string, 8)}
		require.NoError(t, l.Add(fd, 0, r))
		_, err := a.Write([]byte("ignored"))
		require.NoError(t, err)
		require.NoError(t, a.Close())
		assert.Equal(t, "hangup", next(t, r.got))
	})
	t.Run("writable when asked", func(t *testing.T) {
		_, b := pair(t)
		fd, _ := FD(b)
		l := g.Pick()
		got := make(chan Events, 1)
		h := handlerFunc(func(fd int, ev Events) {
			if ev&Writable != 0 {
				_ = l.Remove(fd)
				got <- ev
			}
		})
		require.NoError(t, l.Add(fd, 0, h))
		require.NoError(t, l.Modify(fd, Writable))
		select {
		case ev := <-got:
			assert.NotZero(t, ev&Writable)
		case <-time.After(5 * time.Second):
			t.Fatal("no writable event")
		}
		n, err := Write(fd, []byte("x"))
		assert.Equal(t, 1, n)
		assert.NoError(t, err)
	})
}

type handlerFunc func(int, Events)

func (f handlerFunc) Ready(fd int, ev Events) { f(fd, ev) }

func TestGroupCloseTellsHandlers(t *testing.T) {
	g, err := NewGroup(1)
	require.NoError(t, err)
	_, b := pair(t)
	fd, _ := FD(b)
	l := g.Pick()
	r := &recorder{loop: l, got: make(chan string, 8)}
	require.NoError(t, l.Add(fd, Readable, r))
	g.Close()
	assert.Equal(t, "shutdown", next(t, r.got))
	assert.ErrorIs(t, l.Add(fd, Readable, r), ErrClosed)
	g.Close() // twice is fine
}

func TestWriteWouldBlock(t *testing.T) {
	_, b := pair(t)
	fd, _ := FD(b)
	big := make([]byte, 64<<20)
	n, err := Write(fd, big) // the peer reads nothing: the buffers fill
	assert.ErrorIs(t, err, ErrWouldBlock)
	assert.Positive(t, n)
	assert.Less(t, n, len(big))
}

// TestWrite2: a head and a body too large for the socket's buffers go out
// in order and whole, across writes that would block, each reporting how
// much of each was taken; with the peer reading, every byte arrives once.
func TestWrite2(t *testing.T) {
	a, b := pair(t)
	fd, _ := FD(b)
	head := []byte("HEAD\r\n\r\n")
	body := make([]byte, 16<<20)
	for i := range body {
		body[i] = byte(i % 251)
	}
	got := make(chan []byte, 1)
	go func() {
		buf := make([]byte, 0, len(head)+len(body))
		tmp := make([]byte, 1<<20)
		for len(buf) < cap(buf) {
			n, err := a.Read(tmp)
			buf = append(buf, tmp[:n]...)
			if err != nil {
				break
			}
		}
		got <- buf
	}()
	var na, nb, blocked int
	for na < len(head) || nb < len(body) {
		da, db, err := Write2(fd, head[na:], body[nb:])
		if db > 0 {
			require.Equal(t, len(head), na+da, "the body only after the whole head")
		}
		na, nb = na+da, nb+db
		if errors.Is(err, ErrWouldBlock) {
			blocked++
			time.Sleep(time.Millisecond)
			continue
		}
		require.NoError(t, err)
	}
	assert.Positive(t, blocked, "the socket's buffers filled at least once")
	select {
	case buf := <-got:
		require.Equal(t, len(head)+len(body), len(buf))
		assert.Equal(t, head, buf[:len(head)])
		assert.True(t, bytes.Equal(body, buf[len(head):]), "the body, byte for byte")
	case <-time.After(10 * time.Second):
		t.Fatal("the peer did not receive it all")
	}
	da, db, err := Write2(fd, nil, nil)
	assert.Zero(t, da+db)
	assert.NoError(t, err, "nothing to write")
}

func TestFDPlainSocketsOnly(t *testing.T) {
	a, _ := net.Pipe()
	defer a.Close()
	_, ok := FD(a)
	assert.False(t, ok, "a pipe has no descriptor to watch")
}

// TestPostRunsOnTheLoop: functions posted from many goroutines all run,
// one at a time with the loop's handlers (the race detector checks that
// they share the loop's buffer without locking), and none once the loop
// is closed.
func TestPostRunsOnTheLoop(t *testing.T) {
	g, err := NewGroup(1)
	require.NoError(t, err)
	l := g.Pick()
	const posters, each = 8, 200
	ran := 0 // only the loop's goroutine touches it
	done := make(chan struct{}, posters*each)
	for range posters {
		go func() {
			for range each {
				assert.True(t, l.Post(func() {
					in, _ := l.Buffers()
					in[0]++
					ran++
					done <- struct{}{}
				}))
			}
		}()
	}
	for range posters * each {
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("a posted function did not run")
		}
	}
	ok := make(chan int)
	require.True(t, l.Post(func() { ok <- ran }))
	assert.Equal(t, posters*each, <-ok)
	g.Close()
	assert.False(t, l.Post(func() { t.Error("ran after Close") }), "a closed loop takes nothing")
}
