//go:build linux

package clientconn

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// finIn waits until the kernel has taken the peer's FIN on c (its state is
// CLOSE_WAIT), so that whatever came before the FIN is waiting too.
func finIn(t *testing.T, c *Conn) {
	t.Helper()
	rc, err := c.TCPConn.SyscallConn()
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var state uint8
		err := rc.Control(func(fd uintptr) {
			if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
				state = info.State
			}
		})
		return err == nil && state == unix.BPF_TCP_CLOSE_WAIT
	}, 30*time.Second, time.Millisecond, "the peer's FIN arrived")
}

// TestPeerClosed: a peer that shut its side (or reset) is seen without a
// byte being taken; one with bytes waiting, or still open, is not.
func TestPeerClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	pair := func() (client *net.TCPConn, server *Conn) {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		s, err := ln.Accept()
		require.NoError(t, err)
		t.Cleanup(func() { c.Close(); s.Close() })
		return c.(*net.TCPConn), &Conn{TCPConn: s.(*net.TCPConn)}
	}
	c, s := pair()
	assert.False(t, PeerClosed(s), "open")
	_, err = c.Write([]byte("next"))
	require.NoError(t, err)
	require.NoError(t, c.CloseWrite())
	finIn(t, s)
	assert.False(t, PeerClosed(s), "a pipelined request waits before the FIN")
	b := make([]byte, 4)
	_, err = s.Read(b)
	require.NoError(t, err)
	assert.Equal(t, "next", string(b), "nothing was taken")
	assert.True(t, PeerClosed(s), "half-closed")

	c, s = pair()
	require.NoError(t, c.SetLinger(0))
	require.NoError(t, c.Close())
	require.Eventually(t, func() bool { return PeerClosed(s) }, 30*time.Second, time.Millisecond, "reset")
}
