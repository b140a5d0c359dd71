package kvsource

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/pd-sidecar/pd-sidecar/metrics"
)

// TestParseEndpoint: x-kv-cache-source-host-port is read as host[:port],
// an http(s):// prefix tolerated, and normalised so that one engine written
// two ways compares equal (as llm-d's normalizeEndpoint).
func TestParseEndpoint(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Endpoint
		ok   bool
	}{
		{"10.0.0.5:8000", Endpoint{"10.0.0.5", 8000}, true},
		{" http://10.0.0.5:8000 ", Endpoint{"10.0.0.5", 8000}, true},
		{"HTTPS://10.0.0.5:8000", Endpoint{"10.0.0.5", 8000}, true},
		{"[fd00:0::5]:8001", Endpoint{"fd00::5", 8001}, true},
		{"[::ffff:10.0.0.5]:8001", Endpoint{"10.0.0.5", 8001}, true},
		{"Decode-0.NS.svc:8000", Endpoint{"decode-0.ns.svc", 8000}, true},
		{"10.0.0.5", Endpoint{"10.0.0.5", 0}, true},
		{"[fd00::5]", Endpoint{"fd00::5", 0}, true},
		{"", Endpoint{}, false},
		{":8000", Endpoint{}, false},
		{"http://", Endpoint{}, false},
		{"10.0.0.5:0", Endpoint{}, false},
		{"10.0.0.5:65536", Endpoint{}, false},
		{"10.0.0.5:80x", Endpoint{}, false},
		{"10.0.0.5:8000/path", Endpoint{}, false},
		{"user@10.0.0.5:8000", Endpoint{}, false},
		{"a b:8000", Endpoint{}, false},
	} {
		got, ok := ParseEndpoint(tc.in)
		assert.Equal(t, tc.ok, ok, "%q", tc.in)
		assert.Equal(t, tc.want, got, "%q", tc.in)
	}
}

// TestHostPort: an endpoint is written back as host:port, an IPv6 host
// in brackets, the host alone without a port.
func TestHostPort(t *testing.T) {
	assert.Equal(t, "10.0.0.5:8000", Endpoint{"10.0.0.5", 8000}.HostPort())
	assert.Equal(t, "[fd00::5]:8001", Endpoint{"fd00::5", 8001}.HostPort())
	assert.Equal(t, "decode-0", Endpoint{"decode-0", 0}.HostPort())
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
			p := Ports{HTTP: 8000, Ranks: tc.dp, P2P: 7777}
			assert.Equal(t, tc.want, p.P2PPort(tc.port))
		})
	}
}

// prefixAllowlist admits the host:ports that start with its prefix.
type prefixAllowlist string

func (a prefixAllowlist) Allowed(hostport string) bool { return strings.HasPrefix(hostport, string(a)) }

// TestDecide: a named source is used unless it names no host[:port], the
// allowlist refuses it, it is the request's prefiller (however written),
// or, without a prefiller, the rank of this pod serving the request.
func TestDecide(t *testing.T) {
	own := func(host string) bool { return host == "10.0.0.9" }
	for _, tc := range []struct {
		name    string
		v       string
		r       Request
		want    Endpoint
		outcome string
	}{
		{"used", "10.0.0.5:8000", Request{Prefiller: "10.0.0.6:8000"}, Endpoint{"10.0.0.5", 8000}, metrics.KVSourceUsed},
		{"used, no prefiller", "10.0.0.5:8000", Request{Port: 8000, OwnHost: own}, Endpoint{"10.0.0.5", 8000}, metrics.KVSourceUsed},
		{"malformed", "10.0.0.5:80x", Request{}, Endpoint{}, metrics.KVSourceMalformed},
		{"malformed before the allowlist", "user@10.0.0.5", Request{Allowlist: prefixAllowlist("")}, Endpoint{}, metrics.KVSourceMalformed},
		{"not allowed", "10.0.0.5:8000", Request{Prefiller: "10.0.0.6:8000", Allowlist: prefixAllowlist("10.1.")}, Endpoint{}, metrics.KVSourceNotAllowed},
		{"allowed", "http://10.1.0.5:8000", Request{Prefiller: "10.0.0.6:8000", Allowlist: prefixAllowlist("10.1.")}, Endpoint{"10.1.0.5", 8000}, metrics.KVSourceUsed},
		{"the prefiller", "http://[::ffff:10.0.0.6]:8000", Request{Prefiller: "10.0.0.6:8000"}, Endpoint{}, metrics.KVSourcePrefiller},
		{"the prefiller's host, another port", "10.0.0.6:8001", Request{Prefiller: "10.0.0.6:8000"}, Endpoint{"10.0.0.6", 8001}, metrics.KVSourceUsed},
		{"own rank", "10.0.0.9:8001", Request{Port: 8001, OwnHost: own}, Endpoint{}, metrics.KVSourceOwnRank},
		{"own pod, another rank", "10.0.0.9:8002", Request{Port: 8001, OwnHost: own}, Endpoint{"10.0.0.9", 8002}, metrics.KVSourceUsed},
		{"own rank's port, another pod", "10.0.0.5:8001", Request{Port: 8001, OwnHost: own}, Endpoint{"10.0.0.5", 8001}, metrics.KVSourceUsed},
		{"own rank with a prefiller", "10.0.0.9:8001", Request{Prefiller: "10.0.0.6:8000", Port: 8001, OwnHost: own}, Endpoint{"10.0.0.9", 8001}, metrics.KVSourceUsed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, outcome := Decide(tc.v, tc.r)
			assert.Equal(t, tc.outcome, outcome)
			assert.Equal(t, tc.want, got)
		})
	}
}
