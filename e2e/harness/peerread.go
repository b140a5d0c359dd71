package harness

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// WaitPeerRead waits until the process on the other end of conn (a TCP
// connection over IPv4 loopback to a process on this host) has read every
// byte written on conn so far: conn's send queue is empty (every byte
// reached the peer's kernel and was acknowledged) and the peer socket's
// receive queue is empty, as the kernel reports them in /proc/net/tcp. It is the event a test
// needs when it must know that a server's read came before its next write
// (say, that a read found half a request head), where a pause would only
// make that likely.
func WaitPeerRead(t testing.TB, conn net.Conn, timeout time.Duration) {
	t.Helper()
	local, ok1 := conn.LocalAddr().(*net.TCPAddr)
	remote, ok2 := conn.RemoteAddr().(*net.TCPAddr)
	if !ok1 || !ok2 || local.IP.To4() == nil || remote.IP.To4() == nil {
		t.Fatalf("harness: WaitPeerRead needs an IPv4 TCP connection, got %v -> %v", conn.LocalAddr(), conn.RemoteAddr())
	}
	// The peer's socket: its local address is our remote one and back.
	ours, peer := [2]*net.TCPAddr{local, remote}, [2]*net.TCPAddr{remote, local}
	deadline := time.Now().Add(timeout)
	for {
		unsent, _, foundOurs, err := queues(ours)
		if err != nil {
			t.Fatalf("harness: WaitPeerRead: %v", err)
		}
		_, queued, found, err := queues(peer)
		if err != nil {
			t.Fatalf("harness: WaitPeerRead: %v", err)
		}
		if foundOurs && found && unsent == 0 && queued == 0 {
			return
		}
		if time.Now().After(deadline) {
			if !found || !foundOurs {
				t.Fatalf("harness: no sockets %v <-> %v in /proc/net/tcp{,6} within %v", local, remote, timeout)
			}
			t.Fatalf("harness: %d bytes of %v unsent, %d unread by its peer, for %v", unsent, conn.LocalAddr(), queued, timeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// procTCPAddr writes a as /proc/net/tcp does: the address as the host's
// 32-bit word in hex, a colon, the port in hex.
func procTCPAddr(a *net.TCPAddr) string {
	ip := a.IP.To4()
	return fmt.Sprintf("%08X:%04X", binary.NativeEndian.Uint32(ip), a.Port)
}

// procTCP6Addr writes IPv4 address a as /proc/net/tcp6 shows it on a
// dual-stack socket (a server listening on every address): the IPv4-mapped
// IPv6 address as four host 32-bit words in hex, a colon, the port.
func procTCP6Addr(a *net.TCPAddr) string {
	ip := a.IP.To16()
	var b strings.Builder
	for i := 0; i < 16; i += 4 {
		fmt.Fprintf(&b, "%08X", binary.NativeEndian.Uint32(ip[i:i+4]))
	}
	return fmt.Sprintf("%s:%04X", b.String(), a.Port)
}

// queues finds the socket addrs (local, remote) in /proc/net/tcp, or as a
// dual-stack socket in /proc/net/tcp6, and returns the bytes in its send
// and receive queues.
func queues(addrs [2]*net.TCPAddr) (tx, rx int64, found bool, err error) {
	tx, rx, found, err = queuesIn("/proc/net/tcp", [2]string{procTCPAddr(addrs[0]), procTCPAddr(addrs[1])})
	if found || err != nil {
		return tx, rx, found, err
	}
	return queuesIn("/proc/net/tcp6", [2]string{procTCP6Addr(addrs[0]), procTCP6Addr(addrs[1])})
}

func queuesIn(path string, addrs [2]string) (tx, rx int64, found bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || fields[1] != addrs[0] || fields[2] != addrs[1] {
			continue
		}
		txs, rxs, ok := strings.Cut(fields[4], ":")
		if !ok {
			return 0, 0, false, fmt.Errorf("odd queue field %q", fields[4])
		}
		if tx, err = strconv.ParseInt(txs, 16, 64); err != nil {
			return 0, 0, false, err
		}
		rx, err = strconv.ParseInt(rxs, 16, 64)
		return tx, rx, true, err
	}
	return 0, 0, false, sc.Err()
}
