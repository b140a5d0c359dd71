package clientconn

import (
	"net"
	"net/netip"
)

// PeerAddr is the address of a client connection's peer a: its IP for
// a TCP peer, else the zero Addr.
func PeerAddr(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort().Addr()
	}
	return netip.Addr{}
}
