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
// byte written on conn so far: the peer socket's receive queue, as the
// kernel reports it in /proc/net/tcp, is empty. It is the event a test
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
	peerLocal, peerRemote := procTCPAddr(remote), procTCPAddr(local)
	deadline := time.Now().Add(timeout)
	for {
		queued, found, err := rxQueue(peerLocal, peerRemote)
		if err != nil {
			t.Fatalf("harness: WaitPeerRead: %v", err)
		}
		if found && queued == 0 {
			return
		}
		if time.Now().After(deadline) {
			if !found {
				t.Fatalf("harness: no socket %s -> %s in /proc/net/tcp within %v", peerLocal, peerRemote, timeout)
			}
			t.Fatalf("harness: the peer of %v left %d bytes unread for %v", conn.LocalAddr(), queued, timeout)
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

// rxQueue finds the socket local -> remote in /proc/net/tcp and returns
// the bytes in its receive queue.
func rxQueue(local, remote string) (int64, bool, error) {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || fields[1] != local || fields[2] != remote {
			continue
		}
		_, rx, ok := strings.Cut(fields[4], ":")
		if !ok {
			return 0, false, fmt.Errorf("odd queue field %q", fields[4])
		}
		n, err := strconv.ParseInt(rx, 16, 64)
		return n, true, err
	}
	return 0, false, sc.Err()
}
