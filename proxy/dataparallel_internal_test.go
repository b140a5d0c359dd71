package proxy

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRankFor: x-data-parallel-host-port names rank r as <this pod>:Port+r,
// this pod being POD_IP, else the listen host, else loopback; anything else
// is ErrUnknownRank.
func TestRankFor(t *testing.T) {
	for _, tc := range []struct {
		name, podIP, host, value, engine string
	}{
		{"pod ip, rank 0", "10.0.0.5", "", "10.0.0.5:8000", "127.0.0.1:8200"},
		{"pod ip, rank 2", "10.0.0.5", "", "10.0.0.5:8002", "127.0.0.1:8202"},
		{"pod ip, spaces trimmed", "10.0.0.5", "", " 10.0.0.5:8001 ", "127.0.0.1:8201"},
		{"pod ip, ipv6 written otherwise", "fd00::5", "", "[fd00:0::5]:8001", "127.0.0.1:8201"},
		{"pod ip, past the last rank", "10.0.0.5", "", "10.0.0.5:8003", ""},
		{"pod ip, below rank 0", "10.0.0.5", "", "10.0.0.5:7999", ""},
		{"pod ip, another pod", "10.0.0.5", "", "10.0.0.6:8001", ""},
		{"pod ip set: loopback is not this pod's name", "10.0.0.5", "", "127.0.0.1:8001", ""},
		{"listen host without pod ip", "", "10.0.0.9", "10.0.0.9:8001", "127.0.0.1:8201"},
		{"all interfaces: loopback", "", "", "127.0.0.1:8001", "127.0.0.1:8201"},
		{"all interfaces: localhost", "", "0.0.0.0", "LOCALHOST:8002", "127.0.0.1:8202"},
		{"all interfaces: ipv6 loopback", "", "", "[::1]:8000", "127.0.0.1:8200"},
		{"all interfaces: another host", "", "", "10.0.0.5:8001", ""},
		{"hostname pod ip", "decode-0", "", "Decode-0:8001", "127.0.0.1:8201"},
		{"no port", "10.0.0.5", "", "10.0.0.5", ""},
		{"port not a number", "10.0.0.5", "", "10.0.0.5:80x", ""},
		{"empty", "10.0.0.5", "", "", ""},
		{"two values", "10.0.0.5", "", "10.0.0.5:8000,10.0.0.5:8001", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.DataParallelSize = 3
			cfg.PodIP, cfg.Host = tc.podIP, tc.host
			p := &Proxy{cfg: cfg}
			engine, err := p.rankFor([]byte(tc.value))
			if tc.engine == "" {
				require.ErrorIs(t, err, ErrUnknownRank)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.engine, engine)
		})
	}
}
