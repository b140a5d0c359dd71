package proxy

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPeerClosed: a peer that shut its side (or reset) is seen without a
// byte being taken; one with bytes waiting, or still open, is not.
func TestPeerClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	pair := func() (client *net.TCPConn, server *clientConn) {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		s, err := ln.Accept()
		require.NoError(t, err)
		t.Cleanup(func() { c.Close(); s.Close() })
		return c.(*net.TCPConn), &clientConn{TCPConn: s.(*net.TCPConn)}
	}
	settle := func() { time.Sleep(50 * time.Millisecond) } // loopback delivers in far less

	c, s := pair()
	settle()
	assert.False(t, peerClosed(s), "open")
	_, err = c.Write([]byte("next"))
	require.NoError(t, err)
	require.NoError(t, c.CloseWrite())
	settle()
	assert.False(t, peerClosed(s), "a pipelined request waits before the FIN")
	b := make([]byte, 4)
	_, err = s.Read(b)
	require.NoError(t, err)
	assert.Equal(t, "next", string(b), "nothing was taken")
	assert.True(t, peerClosed(s), "half-closed")

	c, s = pair()
	require.NoError(t, c.SetLinger(0))
	require.NoError(t, c.Close())
	settle()
	assert.True(t, peerClosed(s), "reset")
}
