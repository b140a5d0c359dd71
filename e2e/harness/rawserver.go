package harness

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// RawServer is a TCP server on a loopback address whose every accepted
// connection is handed to a handler as raw bytes: the ground for fake
// upstreams that answer what no real server would (malformed heads,
// endless bodies, silence). It counts the connections it accepts and,
// when its test ends, closes its listener and every connection it
// accepted.
type RawServer struct {
	ln    net.Listener
	conns atomic.Int64

	mu     sync.Mutex
	open   []net.Conn
	closed bool
}

// StartRawServer listens on 127.0.0.1 at a free port and hands each
// connection it accepts to handle, in a goroutine of its own. handle owns
// the connection: it may close it or leave it open (the server closes it
// when t ends, as it does every connection still open then).
func StartRawServer(t testing.TB, handle func(c net.Conn)) *RawServer {
	t.Helper()
	return StartRawServerOn(t, "127.0.0.1", handle)
}

// StartRawServerOn is StartRawServer listening on host (another loopback
// address such as 127.0.0.2, which stands for another host).
func StartRawServerOn(t testing.TB, host string, handle func(c net.Conn)) *RawServer {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatalf("harness: raw server on %s: %v", host, err)
	}
	s := &RawServer{ln: ln}
	t.Cleanup(s.close)
	go s.accept(handle)
	return s
}

func (s *RawServer) accept(handle func(c net.Conn)) {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.conns.Add(1)
		s.mu.Lock()
		if s.closed { // accepted as the test ended
			s.mu.Unlock()
			_ = c.Close()
			return
		}
		s.open = append(s.open, c)
		s.mu.Unlock()
		go handle(c)
	}
}

// close closes the listener and every connection accepted.
func (s *RawServer) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, c := range s.open {
		_ = c.Close()
	}
	s.open = nil
}

// Port is the port the server listens on.
func (s *RawServer) Port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// Addr is the server's host:port.
func (s *RawServer) Addr() string {
	a := s.ln.Addr().(*net.TCPAddr)
	return net.JoinHostPort(a.IP.String(), strconv.Itoa(a.Port))
}

// Conns is how many connections the server accepted so far.
func (s *RawServer) Conns() int64 { return s.conns.Load() }

// ServeRequests reads HTTP/1.1 requests off c one by one, each with its
// body read whole (as far as it came, when it was cut short), and hands
// each to answer, which writes on c what it will. It returns, closing c,
// when a read fails (the peer closed c, or sent what is no request) or
// answer returns false.
func ServeRequests(c net.Conn, answer func(c net.Conn, req *http.Request, body []byte) bool) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, _ := io.ReadAll(req.Body) // a body cut short: the next read fails
		if !answer(c, req, body) {
			return
		}
	}
}
