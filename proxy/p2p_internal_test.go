package proxy

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestParseEndpoint: x-kv-cache-source-host-port is read as host[:port],
// an http(s):// prefix tolerated, and normalised so that one engine written
// two ways compares equal (as llm-d's normalizeEndpoint).
func TestParseEndpoint(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want endpoint
		ok   bool
	}{
		{"10.0.0.5:8000", endpoint{"10.0.0.5", 8000}, true},
		{" http://10.0.0.5:8000 ", endpoint{"10.0.0.5", 8000}, true},
		{"HTTPS://10.0.0.5:8000", endpoint{"10.0.0.5", 8000}, true},
		{"[fd00:0::5]:8001", endpoint{"fd00::5", 8001}, true},
		{"[::ffff:10.0.0.5]:8001", endpoint{"10.0.0.5", 8001}, true},
		{"Decode-0.NS.svc:8000", endpoint{"decode-0.ns.svc", 8000}, true},
		{"10.0.0.5", endpoint{"10.0.0.5", 0}, true},
		{"[fd00::5]", endpoint{"fd00::5", 0}, true},
		{"", endpoint{}, false},
		{":8000", endpoint{}, false},
		{"http://", endpoint{}, false},
		{"10.0.0.5:0", endpoint{}, false},
		{"10.0.0.5:65536", endpoint{}, false},
		{"10.0.0.5:80x", endpoint{}, false},
		{"10.0.0.5:8000/path", endpoint{}, false},
		{"user@10.0.0.5:8000", endpoint{}, false},
		{"a b:8000", endpoint{}, false},
	} {
		got, ok := parseEndpoint(tc.in)
		assert.Equal(t, tc.ok, ok, "%q", tc.in)
		assert.Equal(t, tc.want, got, "%q", tc.in)
	}
}

// TestP2PPort: one rank → --p2p-connector-port; with data-parallel ranks
// the rank the target's port names relative to --port, else rank 0's (a
// port outside the ranks, or none), as llm-d's p2pPortFor.
func TestP2PPort(t *testing.T) {
	for _, tc := range []struct {
		name     string
		dp, port int
		want     int
	}{
		{"one rank", 1, 8003, 7777},
		{"rank 0", 4, 8000, 7777},
		{"rank 3", 4, 8003, 7780},
		{"past the ranks", 4, 8004, 7777},
		{"below the ranks", 4, 7999, 7777},
		{"no port", 4, 0, 7777},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.DataParallelSize = tc.dp
			cfg.P2P = P2PConfig{Enabled: true, Port: 7777}
			p := &Proxy{cfg: cfg}
			assert.Equal(t, tc.want, p.p2pPort(tc.port))
		})
	}
}
