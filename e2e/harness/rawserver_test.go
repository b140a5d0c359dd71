package harness

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRawServerClosesEveryConnectionWhenTheTestEnds: the handler leaves
// its connections open; the server counts them, and closes them and its
// listener once its test is over.
func TestRawServerClosesEveryConnectionWhenTheTestEnds(t *testing.T) {
	var s *RawServer
	var clients []net.Conn
	t.Run("serve", func(t *testing.T) {
		s = StartRawServer(t, func(c net.Conn) { _, _ = io.WriteString(c, "hi") })
		assert.Equal(t, HostPort(s.Port()), s.Addr())
		for range 2 {
			c, err := net.Dial("tcp", s.Addr())
			require.NoError(t, err)
			clients = append(clients, c)
			b := make([]byte, 2)
			_, err = io.ReadFull(c, b)
			require.NoError(t, err)
			assert.Equal(t, "hi", string(b))
		}
		assert.Equal(t, int64(2), s.Conns())
	})
	for _, c := range clients {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		_, err := c.Read(make([]byte, 1))
		assert.ErrorIs(t, err, io.EOF, "the server closed the connection")
		c.Close()
	}
	_, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	assert.Error(t, err, "the listener is closed")
}

// TestServeRequests: requests sent back to back are answered one by one,
// each with its body, until answer says to stop; the connection is closed
// then.
func TestServeRequests(t *testing.T) {
	s := StartRawServer(t, func(c net.Conn) {
		ServeRequests(c, func(c net.Conn, req *http.Request, body []byte) bool {
			answer := req.URL.Path + ":" + string(body)
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+itoa(len(answer))+"\r\n\r\n"+answer)
			return req.URL.Path != "/last"
		})
	})
	c, err := net.Dial("tcp", s.Addr())
	require.NoError(t, err)
	defer c.Close()
	req := func(path, body string) string {
		return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Length: " + itoa(len(body)) + "\r\n\r\n" + body
	}
	_, err = io.WriteString(c, req("/a", "one")+req("/last", "two")+req("/never", "three"))
	require.NoError(t, err)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	br := bufio.NewReader(c)
	for _, want := range []string{"/a:one", "/last:two"} {
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		assert.Equal(t, want, string(b))
	}
	rest, _ := io.ReadAll(br) // EOF, or a reset: the third request was left unread
	assert.Empty(t, string(rest), "no answer after the last")
}
