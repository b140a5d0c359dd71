package clientconn

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// errGone is the cause a watch cancels with when its client left.
var errGone = errors.New("client gone")

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	server, err = ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { _ = server.Close(); _ = client.Close() })
	return server, client
}

func TestWatch(t *testing.T) {
	cases := []struct {
		name string
		// client acts on its end after the given wait; nil: nothing.
		client func(net.Conn)
		// early: the client acts before the watch is armed.
		delay         time.Duration // 0: WatchDelay
		early         bool
		wait          time.Duration
		wantGone      bool
		wantPipelined bool
		wantArmed     bool
	}{
		{name: "answered before the delay: never armed", delay: time.Hour},
		{name: "client stays: armed, stopped cleanly", wait: WatchDelay, wantArmed: true},
		{name: "client leaves during a long wait", wantArmed: true, wantGone: true,
			client: func(c net.Conn) { _ = c.Close() }},
		{name: "client leaves before the watch is armed: noticed once armed", wantArmed: true, wantGone: true,
			early: true, client: func(c net.Conn) { _ = c.Close() }},
		{name: "pipelined request byte", wantArmed: true, wantPipelined: true,
			client: func(c net.Conn) { _, _ = c.Write([]byte("P")) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			server, client := tcpPair(t)
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			delay := tc.delay
			if delay == 0 {
				delay = WatchDelay
			}
			w := NewArmer(delay, errGone).Watch(server, cancel, time.Now())
			armed := func() bool {
				w.mu.Lock()
				defer w.mu.Unlock()
				return w.end != nil
			}
			if tc.client != nil && tc.early {
				tc.client(client)
			}
			if tc.wantArmed {
				require.Eventually(t, armed, 30*time.Second, time.Millisecond)
			}
			if tc.client != nil && !tc.early {
				tc.client(client)
			}
			if tc.wantGone {
				select {
				case <-ctx.Done():
				case <-time.After(30 * time.Second):
					t.Fatal("the client's leaving was not noticed")
				}
				require.ErrorIs(t, context.Cause(ctx), errGone)
			} else {
				time.Sleep(tc.wait)
				require.NoError(t, ctx.Err())
			}
			require.Equal(t, tc.wantArmed, armed())
			pipelined := w.Stop()
			require.Equal(t, pipelined, w.Stop(), "stop is idempotent")
			if tc.wantPipelined && !pipelined {
				// Stopped before the watcher read the byte: it is still on
				// the connection for the server. Either way nothing is lost.
				b := make([]byte, 1)
				require.NoError(t, server.SetReadDeadline(time.Now().Add(30*time.Second)))
				_, err := server.Read(b)
				require.NoError(t, err)
				require.Equal(t, byte('P'), b[0])
				pipelined = true
			}
			require.Equal(t, tc.wantPipelined, pipelined)
			if !tc.wantGone && !tc.wantPipelined {
				// The connection is still usable: a read deadline the watch
				// set is cleared.
				_, err := client.Write([]byte("x"))
				require.NoError(t, err)
				b := make([]byte, 1)
				require.NoError(t, server.SetReadDeadline(time.Now().Add(30*time.Second)))
				_, err = server.Read(b)
				require.NoError(t, err)
				require.Equal(t, byte('x'), b[0])
			}
		})
	}
}

// TestArmer: one timer arms every due watch, in order, skips the
// stopped ones, and comes back for the ones not yet due.
func TestArmer(t *testing.T) {
	const delay = 20 * time.Millisecond
	a := NewArmer(delay, errGone)
	armed := func(w *Watch) bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.end != nil
	}
	now := time.Now()
	var ws []*Watch
	for i, since := range []time.Time{now.Add(-time.Second), now.Add(-time.Second), now, now.Add(time.Hour)} {
		server, _ := tcpPair(t)
		_, cancel := context.WithCancelCause(context.Background())
		t.Cleanup(func() { cancel(nil) })
		ws = append(ws, a.Watch(server, cancel, since))
		if i == 1 {
			ws[1].Stop() // answered before it was due
		}
	}
	// The first is due at once, the third after the delay; the second was
	// stopped and the last is not due for an hour.
	require.Eventually(t, func() bool { return armed(ws[0]) && armed(ws[2]) }, 30*time.Second, time.Millisecond)
	require.False(t, armed(ws[1]), "a stopped watch is never armed")
	require.False(t, armed(ws[3]), "a watch is not armed before its delay")
	a.mu.Lock()
	require.Equal(t, []*Watch{ws[3]}, a.queue, "armed and stopped watches leave the queue")
	require.True(t, a.pending, "the timer waits for the last one")
	a.mu.Unlock()
	for _, w := range ws {
		require.False(t, w.Stop(), "nothing was pipelined")
	}
	require.False(t, armed(ws[0]), "stop ends the watcher")
}
