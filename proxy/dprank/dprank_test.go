package dprank_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/proxy/dprank"
)

// TestRank: x-data-parallel-host-port names rank r as <this pod>:Port+r,
// this pod being POD_IP, else the listen host, else loopback; anything else
// is ErrUnknown.
func TestRank(t *testing.T) {
	for _, tc := range []struct {
		name, podIP, host, value string
		rank                     int // -1: ErrUnknown
	}{
		{"pod ip, rank 0", "10.0.0.5", "", "10.0.0.5:8000", 0},
		{"pod ip, rank 2", "10.0.0.5", "", "10.0.0.5:8002", 2},
		{"pod ip, spaces trimmed", "10.0.0.5", "", " 10.0.0.5:8001 ", 1},
		{"pod ip, ipv6 written otherwise", "fd00::5", "", "[fd00:0::5]:8001", 1},
		{"pod ip, past the last rank", "10.0.0.5", "", "10.0.0.5:8003", -1},
		{"pod ip, below rank 0", "10.0.0.5", "", "10.0.0.5:7999", -1},
		{"pod ip, another pod", "10.0.0.5", "", "10.0.0.6:8001", -1},
		{"pod ip set: loopback is not this pod's name", "10.0.0.5", "", "127.0.0.1:8001", -1},
		{"listen host without pod ip", "", "10.0.0.9", "10.0.0.9:8001", 1},
		{"all interfaces: loopback", "", "", "127.0.0.1:8001", 1},
		{"all interfaces: localhost", "", "0.0.0.0", "LOCALHOST:8002", 2},
		{"all interfaces: ipv6 loopback", "", "", "[::1]:8000", 0},
		{"all interfaces: another host", "", "", "10.0.0.5:8001", -1},
		{"hostname pod ip", "decode-0", "", "Decode-0:8001", 1},
		{"no port", "10.0.0.5", "", "10.0.0.5", -1},
		{"port not a number", "10.0.0.5", "", "10.0.0.5:80x", -1},
		{"empty", "10.0.0.5", "", "", -1},
		{"two values", "10.0.0.5", "", "10.0.0.5:8000,10.0.0.5:8001", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := dprank.Pod{Port: 8000, Size: 3, PodIP: tc.podIP, Host: tc.host}
			rank, err := p.Rank([]byte(tc.value))
			if tc.rank < 0 {
				require.ErrorIs(t, err, dprank.ErrUnknown)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.rank, rank)
		})
	}
}

// TestRankErrorNamesTheRanks: the refusal says which values would name a
// rank.
func TestRankErrorNamesTheRanks(t *testing.T) {
	for _, tc := range []struct {
		pod  dprank.Pod
		want string
	}{
		{dprank.Pod{Port: 8000, Size: 3, PodIP: "10.0.0.5"}, `"10.0.0.6:8001" (ranks are 10.0.0.5:8000 to port 8002)`},
		{dprank.Pod{Port: 8000, Size: 1, Host: "0.0.0.0"}, `"10.0.0.6:8001" (ranks are 127.0.0.1:8000)`},
	} {
		_, err := tc.pod.Rank([]byte("10.0.0.6:8001"))
		require.ErrorIs(t, err, dprank.ErrUnknown)
		assert.Contains(t, err.Error(), tc.want)
	}
}
