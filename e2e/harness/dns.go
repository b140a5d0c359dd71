package harness

import (
	"net"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// DNSServer is a tiny authoritative DNS server on UDP loopback for tests
// that need host names whose answers change while a process runs: it
// answers A queries from its table and NXDOMAIN for names not in it (or
// every name while failing).
type DNSServer struct {
	// Addr is its host:port.
	Addr string
	conn net.PacketConn

	mu      sync.Mutex
	hosts   map[string]net.IP
	failing bool
}

// StartDNSServer serves hosts (name → IPv4) until the test ends.
func StartDNSServer(t testing.TB, hosts map[string]string) *DNSServer {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("harness: dns listen: %v", err)
	}
	s := &DNSServer{Addr: c.LocalAddr().String(), conn: c, hosts: map[string]net.IP{}}
	for n, ip := range hosts {
		s.Set(n, ip)
	}
	t.Cleanup(func() { c.Close() })
	go s.serve()
	return s
}

// Set maps name to the IPv4 address ip.
func (s *DNSServer) Set(name, ip string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hosts[strings.TrimSuffix(strings.ToLower(name), ".")] = net.ParseIP(ip).To4()
}

// Fail makes every lookup fail (NXDOMAIN) while on.
func (s *DNSServer) Fail(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failing = on
}

func (s *DNSServer) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := s.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		if out, ok := s.answer(buf[:n]); ok {
			_, _ = s.conn.WriteTo(out, from)
		}
	}
}

// answer builds the reply to one query.
func (s *DNSServer) answer(q []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil, false
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		return nil, false
	}
	question := qs[0]
	name := strings.TrimSuffix(strings.ToLower(question.Name.String()), ".")
	s.mu.Lock()
	ip, known := s.hosts[name]
	failing := s.failing
	s.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	if failing || !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if b.StartQuestions() != nil || b.Question(question) != nil || b.StartAnswers() != nil {
		return nil, false
	}
	if rh.RCode == dnsmessage.RCodeSuccess && question.Type == dnsmessage.TypeA {
		var a [4]byte
		copy(a[:], ip)
		rr := dnsmessage.ResourceHeader{Name: question.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 0}
		if b.AResource(rr, dnsmessage.AResource{A: a}) != nil {
			return nil, false
		}
	}
	out, err := b.Finish()
	return out, err == nil
}
