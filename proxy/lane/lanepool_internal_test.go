package lane

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/inference"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// TestLanePoolBounds: the lane pools upstream connections per address up
// to --max-idle-conns-per-host (over its loops), for the local engine and
// at most as many other addresses as the transport keeps pools for (so
// forged prefiller addresses cannot grow it); the sweeper's evict closes
// those unused for laneIdleMax and forgets the prefillers left with none.
func TestLanePoolBounds(t *testing.T) {
	p := &inference.Proxy{Sidecar: &core.Sidecar{Cfg: core.DefaultConfig(), Tr: upstream.NewTransport(time.Second, 2, 2)}}
	p.Cfg.MaxConnsPerHost = 2
	ln := &lane{p: p, local: "127.0.0.1:8200"}
	ll := &laneLoop{ln: ln, idle: map[string][]*upConn{}}
	ln.loops = []*laneLoop{ll}
	type conn struct {
		u    *upConn
		peer net.Conn
	}
	put := func(addr string) conn {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		u := &upConn{ll: ll, addr: addr, conn: a}
		ll.put(u)
		return conn{u, b}
	}
	closed := func(c conn) bool { // the pooled end closed, not a read timing out
		if err := c.peer.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
			return errors.Is(err, io.ErrClosedPipe)
		}
		_, err := c.peer.Read(make([]byte, 1))
		return errors.Is(err, io.EOF)
	}
	local := []conn{put(ln.local), put(ln.local), put(ln.local)}
	assert.False(t, closed(local[0]))
	assert.False(t, closed(local[1]))
	assert.True(t, closed(local[2]), "a third idle connection to one address is closed")
	pre := []conn{put("10.0.0.1:8000"), put("10.0.0.2:8000"), put("10.0.0.3:8000")}
	assert.False(t, closed(pre[0]))
	assert.False(t, closed(pre[1]))
	assert.True(t, closed(pre[2]), "no pool for a third prefiller address")
	assert.Len(t, ll.idle, 3)

	assert.Same(t, pre[0].u, ll.pop("10.0.0.1:8000"))
	assert.Nil(t, ll.pop("10.0.0.1:8000"))
	ll.evict(time.Now().Add(laneIdleMax))
	for _, c := range []conn{local[0], local[1], pre[1]} {
		assert.True(t, closed(c), "evicted after laneIdleMax unused")
	}
	assert.False(t, closed(pre[0]), "a connection taken from the pool is its taker's")
	assert.Equal(t, []string{ln.local}, keys(ll.idle), "the prefillers left with none are forgotten")
}

func keys(m map[string][]*upConn) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
