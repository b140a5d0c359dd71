package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors/moriio"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
	"github.com/pd-sidecar/pd-sidecar/proxy/encoder"
	"github.com/pd-sidecar/pd-sidecar/ssrf"
)

// llmdFlagNames are the flags of llm-d's sidecar: llm-d-router's pd-sidecar
// at commit ebab687 (v0.10), its options.go and --help (the
// configuration-file tests try every key of --configuration and
// --configuration-file).
var llmdFlagNames = []string{
	"port", "model-server-port", "vllm-port", "data-parallel-size", "kv-connector", "ec-connector",
	"mooncake-bootstrap-port", "p2p-connector-port", "enable-p2p-pull", "secure-proxy", "cert-path",
	"enable-ssrf-protection", "enable-prefiller-sampling", "enable-tls", "tls-insecure-skip-verify",
	"inference-pool", "pool-group", "max-idle-conns-per-host", "prefill-max-retries",
	"prefill-retry-backoff", "decode-chunk-size", "tracing", "metrics-port",
	"moriio-write-mode", "moriio-decode-notify-port", "moriio-decode-handshake-port",
	"moriio-local-pod-ip", "moriio-parallel-dispatch", "moriio-parallel-decode-wait-timeout",
	"moriio-prefill-handshake-port", "moriio-prefill-notify-port", "moriio-tp-size", "moriio-dp-size",
	"moriio-remote-hosts", "moriio-dp-size-local", "moriio-decode-hosts",
	"zap-devel", "zap-encoder", "zap-log-level", "zap-stacktrace-level", "zap-time-encoding",
	"configuration", "configuration-file",
}

// llmdFlagTable gives every flag of llmdFlagNames a typical value, as in
// llm-d-router v0.10's options.go, and what it sets in our options.
var llmdFlagTable = []struct {
	flag  string
	args  []string
	check func(t *testing.T, o options)
}{
	{"port", []string{"--port=8001"}, func(t *testing.T, o options) { assert.Equal(t, 8001, o.cfg.Port) }},
	{"configuration", []string{"--configuration=port: 8003"}, func(t *testing.T, o options) { assert.Equal(t, 8003, o.cfg.Port) }},
	{"configuration-file", []string{"--configuration-file=testdata/llmd-configuration.yaml"}, func(t *testing.T, o options) {
		assert.Equal(t, 8004, o.cfg.Port)
		assert.Equal(t, 8204, o.cfg.ModelServerPort)
	}},
	{"model-server-port", []string{"--model-server-port=8201"}, func(t *testing.T, o options) { assert.Equal(t, 8201, o.cfg.ModelServerPort) }},
	{"vllm-port", []string{"--vllm-port=8202"}, func(t *testing.T, o options) { assert.Equal(t, 8202, o.cfg.ModelServerPort) }},
	// As in llm-d, --model-server-port wins over the deprecated --vllm-port, in either order.
	{"vllm-port", []string{"--model-server-port=8201", "--vllm-port=8202"}, func(t *testing.T, o options) { assert.Equal(t, 8201, o.cfg.ModelServerPort) }},
	{"vllm-port", []string{"--vllm-port=8202", "--model-server-port=8201"}, func(t *testing.T, o options) { assert.Equal(t, 8201, o.cfg.ModelServerPort) }},
	{"data-parallel-size", []string{"--data-parallel-size=4"}, func(t *testing.T, o options) { assert.Equal(t, 4, o.cfg.DataParallelSize) }},
	{"kv-connector", []string{"--kv-connector=shared-storage"}, func(t *testing.T, o options) { assert.Equal(t, "shared-storage", o.connector) }},
	{"kv-connector", []string{"--kv-connector=mooncake"}, func(t *testing.T, o options) { assert.Equal(t, "mooncake", o.connector) }},
	{"kv-connector", []string{"--kv-connector=sglang"}, func(t *testing.T, o options) { assert.Equal(t, "sglang", o.connector) }},
	{"ec-connector", []string{"--ec-connector="}, func(t *testing.T, o options) { assert.Empty(t, o.llmd.ecConnector) }},
	{"mooncake-bootstrap-port", []string{"--mooncake-bootstrap-port=8000"}, func(t *testing.T, o options) { assert.Equal(t, 8000, o.connectorOpts.mooncakeBootstrapPort) }},
	{"p2p-connector-port", []string{"--p2p-connector-port=7800"}, func(t *testing.T, o options) { assert.Equal(t, 7800, o.llmd.p2pConnectorPort) }},
	{"enable-p2p-pull", []string{"--enable-p2p-pull=false"}, func(t *testing.T, o options) { assert.False(t, o.llmd.enableP2PPull) }},
	{"secure-proxy", []string{"--secure-proxy=true"}, func(t *testing.T, o options) { assert.True(t, o.cfg.Guard.TLS.SecureProxy) }},
	{"secure-proxy", []string{"--secure-proxy=false"}, func(t *testing.T, o options) { assert.False(t, o.cfg.Guard.TLS.SecureProxy) }},
	{"cert-path", []string{"--secure-proxy", "--cert-path=/etc/certs"}, func(t *testing.T, o options) { assert.Equal(t, "/etc/certs", o.cfg.Guard.TLS.CertPath) }},
	{"enable-ssrf-protection", []string{"--enable-ssrf-protection=true", "--inference-pool=ns/pool"}, func(t *testing.T, o options) { assert.True(t, o.guard.ssrf) }},
	{"enable-prefiller-sampling", []string{"--enable-prefiller-sampling=true"}, func(t *testing.T, o options) { assert.True(t, o.cfg.PrefillerSampling) }},
	{"enable-tls", []string{"--enable-tls=prefiller,decoder,encoder"}, func(t *testing.T, o options) {
		assert.True(t, o.cfg.Guard.TLS.Prefiller)
		assert.True(t, o.cfg.Guard.TLS.Decoder)
	}},
	{"tls-insecure-skip-verify", []string{"--tls-insecure-skip-verify=prefiller", "--tls-insecure-skip-verify=decoder"}, func(t *testing.T, o options) {
		assert.True(t, o.cfg.Guard.TLS.InsecureSkipVerifyPrefiller)
		assert.True(t, o.cfg.Guard.TLS.InsecureSkipVerifyDecoder)
	}},
	{"inference-pool", []string{"--inference-pool=ns/pool"}, func(t *testing.T, o options) { assertPool(t, o, "ns", "pool") }},
	{"inference-pool", []string{"--inference-pool=my-pool"}, func(t *testing.T, o options) { assertPool(t, o, "default", "my-pool") }},
	{"pool-group", []string{"--pool-group=inference.networking.x-k8s.io"}, func(t *testing.T, o options) { assert.Equal(t, ssrf.GroupV1Alpha2, o.guard.poolGroup) }},
	{"max-idle-conns-per-host", []string{"--max-idle-conns-per-host=64"}, func(t *testing.T, o options) { assert.Equal(t, 64, o.cfg.MaxConnsPerHost) }},
	{"prefill-max-retries", []string{"--prefill-max-retries=2"}, func(t *testing.T, o options) { assert.Equal(t, 2, o.cfg.PrefillMaxRetries) }},
	{"prefill-retry-backoff", []string{"--prefill-retry-backoff=300ms"}, func(t *testing.T, o options) { assert.Equal(t, 300*time.Millisecond, o.cfg.PrefillRetryBackoff) }},
	{"decode-chunk-size", []string{"--decode-chunk-size=0"}, func(t *testing.T, o options) { assert.Zero(t, o.llmd.decodeChunkSize) }},
	{"decode-chunk-size", []string{"--decode-chunk-size=16"}, func(t *testing.T, o options) { assert.Equal(t, 16, o.cfg.DecodeChunkSize) }},
	{"tracing", []string{"--tracing=true"}, func(t *testing.T, o options) { assert.True(t, o.tracing) }},
	{"metrics-port", []string{"--metrics-port=9090"}, func(t *testing.T, o options) { assert.Equal(t, 9090, o.cfg.MetricsPort) }},
	{"moriio-write-mode", []string{"--moriio-write-mode=false"}, func(t *testing.T, o options) { assert.False(t, o.llmd.moriio.writeMode) }},
	{"moriio-decode-notify-port", []string{"--moriio-decode-notify-port=61006"}, func(t *testing.T, o options) { assert.Equal(t, 61006, o.llmd.moriio.decodeNotify) }},
	{"moriio-decode-handshake-port", []string{"--moriio-decode-handshake-port=6302"}, func(t *testing.T, o options) { assert.Equal(t, 6302, o.llmd.moriio.decodeHandshake) }},
	{"moriio-local-pod-ip", []string{"--moriio-local-pod-ip=10.0.0.5"}, func(t *testing.T, o options) { assert.Equal(t, "10.0.0.5", o.llmd.moriio.localPodIP) }},
	{"moriio-parallel-dispatch", []string{"--moriio-parallel-dispatch=false"}, func(t *testing.T, o options) { assert.False(t, o.llmd.moriio.parallelDispatch) }},
	{"moriio-parallel-decode-wait-timeout", []string{"--moriio-parallel-decode-wait-timeout=10s"}, func(t *testing.T, o options) { assert.Equal(t, 10*time.Second, o.llmd.moriio.waitTimeout) }},
	{"moriio-prefill-handshake-port", []string{"--moriio-prefill-handshake-port=6303"}, func(t *testing.T, o options) { assert.Equal(t, 6303, o.llmd.moriio.prefillHandshake) }},
	{"moriio-prefill-notify-port", []string{"--moriio-prefill-notify-port=61007"}, func(t *testing.T, o options) { assert.Equal(t, 61007, o.llmd.moriio.prefillNotify) }},
	{"moriio-tp-size", []string{"--moriio-tp-size=2"}, func(t *testing.T, o options) { assert.Equal(t, 2, o.llmd.moriio.tpSize) }},
	{"moriio-dp-size", []string{"--moriio-dp-size=8"}, func(t *testing.T, o options) { assert.Equal(t, 8, o.llmd.moriio.dpSize) }},
	{"moriio-remote-hosts", []string{"--moriio-dp-size=16", "--moriio-dp-size-local=8", "--moriio-remote-hosts=prefill-master.ns.svc,prefill-worker.ns.svc"}, func(t *testing.T, o options) {
		assert.Equal(t, []string{"prefill-master.ns.svc", "prefill-worker.ns.svc"}, o.llmd.moriio.remoteHosts)
	}},
	{"moriio-dp-size-local", []string{"--moriio-dp-size-local=8"}, func(t *testing.T, o options) { assert.Equal(t, 8, o.llmd.moriio.dpSizeLocal) }},
	{"moriio-decode-hosts", []string{"--moriio-dp-size=16", "--moriio-dp-size-local=8", "--moriio-decode-hosts=decode-master.ns.svc,decode-worker.ns.svc"}, func(t *testing.T, o options) {
		assert.Equal(t, []string{"decode-master.ns.svc", "decode-worker.ns.svc"}, o.llmd.moriio.decodeHosts)
	}},
	{"zap-devel", []string{"--zap-devel"}, func(t *testing.T, o options) { assert.Equal(t, zerolog.DebugLevel, o.logLevel) }},
	{"zap-encoder", []string{"--zap-encoder=console"}, func(t *testing.T, o options) { assert.Equal(t, "console", o.llmd.zap.encoder.value) }},
	{"zap-encoder", []string{"--zap-encoder=json"}, func(t *testing.T, o options) { assert.Equal(t, "json", o.llmd.zap.encoder.value) }},
	{"zap-log-level", []string{"--zap-log-level=debug"}, func(t *testing.T, o options) { assert.Equal(t, zerolog.DebugLevel, o.logLevel) }},
	{"zap-log-level", []string{"--zap-log-level=4"}, func(t *testing.T, o options) { assert.Equal(t, zerolog.DebugLevel, o.logLevel) }},
	{"zap-log-level", []string{"--zap-log-level=5"}, func(t *testing.T, o options) { assert.Equal(t, zerolog.TraceLevel, o.logLevel) }},
	{"zap-stacktrace-level", []string{"--zap-stacktrace-level=error"}, func(t *testing.T, o options) { assert.Equal(t, "error", o.llmd.zap.stackLevel.value) }},
	{"zap-time-encoding", []string{"--zap-time-encoding=iso8601"}, func(t *testing.T, o options) { assert.Equal(t, "iso8601", o.llmd.zap.timeEnc) }},
}

func assertPool(t *testing.T, o options, ns, name string) {
	t.Helper()
	pc, err := ssrf.ParsePool(o.guard.pool, o.guard.poolGroup)
	require.NoError(t, err)
	assert.Equal(t, ns, pc.Namespace)
	assert.Equal(t, name, pc.Name)
}

// clearLLMDEnv unsets the environment variables llm-d's flags default
// from, so that the machine running the test does not change them.
func clearLLMDEnv(t *testing.T) {
	for _, v := range []string{"MOONCAKE_BOOTSTRAP_PORT", "P2P_CONNECTOR_PORT", "ENABLE_PREFILLER_SAMPLING", "INFERENCE_POOL", "POD_IP", "SGLANG_BOOTSTRAP_PORT",
		"MORIIO_DNS_RESOLVE_TTL_SECONDS", "MORIIO_DNS_RESOLVE_TIMEOUT_SECONDS", "MORIIO_DNS_SERVER", "MORIIO_METRICS_ADDR"} {
		t.Setenv(v, "")
	}
}

// TestLLMDFlagTable feeds every row of llm-d's flag table through our
// parser.
func TestLLMDFlagTable(t *testing.T) {
	clearLLMDEnv(t)
	covered := map[string]bool{}
	for _, row := range llmdFlagTable {
		covered[row.flag] = true
		t.Run(strings.Join(row.args, " "), func(t *testing.T) {
			o, err := parseFlags(row.args, io.Discard)
			require.NoError(t, err)
			row.check(t, o)
		})
	}
	for _, f := range llmdFlagNames {
		assert.True(t, covered[f], "llm-d's --%s has a row", f)
	}
}

// TestLLMDDeploymentArgs parses llm-d's deployment arg lists, copied
// verbatim (llm-d-router v0.10's deployment manifests, the ${VAR}s substituted with the
// values llm-d's scripts and e2e use), and the lists llm-d-modelservice
// renders. Lists that turn on a feature not built yet (the encoder stage,
// MoRI-IO) are refused with one line saying so; llm-d's own stale list
// with single-dash flags is refused by llm-d too.
func TestLLMDDeploymentArgs(t *testing.T) {
	clearLLMDEnv(t)
	tests := []struct {
		name    string
		args    string
		wantErr string
		check   func(t *testing.T, o options)
	}{
		{name: "vllm-decode", args: "--port=8000 --secure-proxy=false --data-parallel-size=2", check: func(t *testing.T, o options) {
			assert.Equal(t, 2, o.cfg.DataParallelSize)
			assert.Equal(t, 8200, o.cfg.ModelServerPort)
		}},
		{name: "p-d nixlv2", args: "--port=8000 --kv-connector=nixlv2 --mooncake-bootstrap-port=8000 --secure-proxy=false --data-parallel-size=1"},
		{name: "p-d shared-storage", args: "--port=8000 --kv-connector=shared-storage --mooncake-bootstrap-port=8000 --secure-proxy=false --data-parallel-size=1"},
		{name: "p-d mooncake", args: "--port=8000 --kv-connector=mooncake --mooncake-bootstrap-port=8000 --secure-proxy=false --data-parallel-size=2", check: func(t *testing.T, o options) {
			assert.Equal(t, "mooncake", o.connector)
			assert.Equal(t, 8000, o.connectorOpts.mooncakeBootstrapPort)
		}},
		{name: "p-d offloading", args: "--port=8000 --kv-connector=offloading --p2p-connector-port=7000 --data-parallel-size=2", check: func(t *testing.T, o options) {
			assert.Equal(t, "offloading", o.connector)
			assert.Equal(t, core.P2PConfig{Enabled: true, Port: 7000}, o.cfg.P2P)
		}},
		{name: "p-d nixlv2 p2p pull", args: "--port=8000 --kv-connector=nixlv2 --enable-p2p-pull", check: func(t *testing.T, o options) {
			assert.Equal(t, core.P2PConfig{Enabled: true, Port: 7777}, o.cfg.P2P)
		}},
		{name: "p-d nixlv2 no p2p pull", args: "--port=8000 --kv-connector=nixlv2", check: func(t *testing.T, o options) {
			assert.False(t, o.cfg.P2P.Enabled, "x-kv-cache-source-host-port is ignored without --enable-p2p-pull")
		}},
		{name: "e-pd", args: "--port=8000 --ec-connector=ec-example --secure-proxy=false --data-parallel-size=1", check: func(t *testing.T, o options) {
			assert.Equal(t, "ec-example", o.cfg.Encoder.Connector)
			assert.Equal(t, encoder.FailError, o.cfg.Encoder.OnFailure, "llm-d's 502 by default")
		}},
		{name: "e-pd ec-nixl", args: "--port=8000 --ec-connector=ec-nixl --secure-proxy=false --data-parallel-size=1", check: func(t *testing.T, o options) {
			assert.Equal(t, "ec-nixl", o.cfg.Encoder.Connector)
		}},
		{name: "e-p-d", args: "--port=8000 --kv-connector=shared-storage --ec-connector=ec-example --secure-proxy=false --data-parallel-size=1", check: func(t *testing.T, o options) {
			assert.Equal(t, "shared-storage", o.connector)
			assert.Equal(t, "ec-example", o.cfg.Encoder.Connector)
		}},
		{name: "encoder TLS stage", args: "--ec-connector=ec-nixl --enable-tls=encoder --tls-insecure-skip-verify=encoder", check: func(t *testing.T, o options) {
			assert.True(t, o.cfg.Encoder.TLS)
			assert.True(t, o.cfg.Encoder.InsecureSkipVerify)
			assert.False(t, o.cfg.Guard.TLS.Prefiller)
		}},
		{name: "test pod-qwen", args: "--port=8000 --model-server-port=8001", check: func(t *testing.T, o options) { assert.Equal(t, 8001, o.cfg.ModelServerPort) }},
		{name: "stale nixl decoder pod", args: "-port=8000 -connector=nixlv2 -v=6", wantErr: "unknown shorthand flag: 'p'"},
		{name: "MoRI-IO serial", args: "--moriio-write-mode=true --moriio-dp-size=8 --moriio-tp-size=1 --moriio-local-pod-ip=10.0.0.5", check: func(t *testing.T, o options) {
			m := o.cfg.MoriIO
			assert.True(t, m.WriteMode)
			assert.False(t, m.ParallelDispatch)
			assert.Equal(t, moriio.Ports{DecodeNotify: 61005, DecodeHandshake: 6301, PrefillNotify: 61005, PrefillHandshake: 6301, TPSize: 1, DPSize: 8}, m.Ports)
			assert.Equal(t, "10.0.0.5", m.PodIP)
			assert.Equal(t, 30*time.Second, m.DNSTTL)
			assert.Equal(t, 5*time.Second, m.DNSTimeout)
			assert.Empty(t, m.Seed, "a literal IP is not resolved")
		}},
		{name: "MoRI-IO parallel", args: "--moriio-write-mode=true --moriio-parallel-dispatch=true --moriio-dp-size=8 --moriio-tp-size=1 --moriio-local-pod-ip=10.0.0.5", check: func(t *testing.T, o options) {
			assert.True(t, o.cfg.MoriIO.ParallelDispatch)
			assert.Equal(t, 30*time.Second, o.cfg.MoriIO.WaitTimeout)
		}},
		// The 2P2D list names in-cluster Services: outside a cluster they do
		// not resolve, and start-up fails as llm-d's does (e2e runs the list
		// verbatim against a DNS server that knows them).
		{name: "MoRI-IO 2P2D", args: "--moriio-write-mode=true --moriio-dp-size=16 --moriio-dp-size-local=8 --moriio-tp-size=1 --moriio-remote-hosts=prefill-master.ns.svc,prefill-worker.ns.svc --moriio-decode-hosts=decode-master.ns.svc,decode-worker.ns.svc --moriio-local-pod-ip=10.0.0.5", wantErr: `MoRI-IO host "prefill-master.ns.svc" does not resolve`},
		{name: "MoRI-IO 2P2D resolvable", args: "--moriio-write-mode=true --moriio-dp-size=16 --moriio-dp-size-local=8 --moriio-tp-size=1 --moriio-remote-hosts=localhost,127.0.0.2 --moriio-decode-hosts=127.0.0.3,localhost --moriio-local-pod-ip=10.0.0.5", check: func(t *testing.T, o options) {
			m := o.cfg.MoriIO
			assert.Equal(t, []string{"localhost", "127.0.0.2"}, m.RemoteHosts)
			assert.Equal(t, []string{"127.0.0.3", "localhost"}, m.DecodeHosts)
			assert.Equal(t, map[string]string{"localhost": "127.0.0.1"}, m.Seed, "names resolved at start-up, IPv4 first")
		}},
		// llm-d-modelservice v0.4.12's routingProxy defaults, and older charts' -v.
		{name: "modelservice defaults", args: "--port=8000 --vllm-port=8200 --connector=nixlv2 --zap-encoder=json --zap-log-level=debug --secure-proxy=false", check: func(t *testing.T, o options) {
			assert.Equal(t, "nixlv2", o.connector)
			assert.Equal(t, zerolog.DebugLevel, o.logLevel)
			assert.False(t, o.cfg.Guard.TLS.SecureProxy)
		}},
		{name: "modelservice before v0.3.8", args: "--port=8000 --vllm-port=8200 --connector=nixlv2 -v=5"},
		{name: "modelservice connector nixl", args: "--port=8000 --vllm-port=8200 --connector=nixl", check: func(t *testing.T, o options) { assert.Equal(t, "nixlv2", o.connector) }},
		{name: "modelservice every key", args: "--port=8000 --vllm-port=8200 --connector=nixlv2 --zap-devel=true --zap-encoder=console --zap-log-level=info --zap-stacktrace-level=panic --zap-time-encoding=rfc3339 --secure-proxy=true --prefiller-use-tls=true --cert-path=/etc/certs", check: func(t *testing.T, o options) {
			assert.Equal(t, zerolog.InfoLevel, o.logLevel, "--zap-log-level beats --zap-devel")
			assert.True(t, o.cfg.Guard.TLS.SecureProxy)
			assert.True(t, o.cfg.Guard.TLS.Prefiller)
			assert.Equal(t, "/etc/certs", o.cfg.Guard.TLS.CertPath)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(strings.Fields(tc.args), io.Discard)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			if tc.check != nil {
				tc.check(t, o)
			}
		})
	}
}

// TestLLMDRemovedFlags: the flags llm-d 0.10 removed (it exits 2 on them)
// keep their old meaning here, because llm-d-modelservice still renders
// them.
func TestLLMDRemovedFlags(t *testing.T) {
	clearLLMDEnv(t)
	tests := []struct {
		args  []string
		check func(t *testing.T, o options)
	}{
		{[]string{"--connector=nixlv2"}, func(t *testing.T, o options) { assert.Equal(t, "nixlv2", o.connector) }},
		{[]string{"--connector=nixl"}, func(t *testing.T, o options) { assert.Equal(t, "nixlv2", o.connector) }},
		{[]string{"--connector=sglang"}, func(t *testing.T, o options) { assert.Equal(t, "sglang", o.connector) }},
		{[]string{"--connector=offloading"}, func(t *testing.T, o options) {
			assert.Equal(t, "offloading", o.connector)
			assert.True(t, o.cfg.P2P.Enabled)
		}},
		{[]string{"--connector=nixlv2", "--kv-connector=shared-storage"}, func(t *testing.T, o options) { assert.Equal(t, "shared-storage", o.connector) }},
		{[]string{"--prefiller-use-tls"}, func(t *testing.T, o options) {
			assert.True(t, o.cfg.Guard.TLS.Prefiller)
			assert.False(t, o.cfg.Guard.TLS.Decoder)
		}},
		{[]string{"--decoder-use-tls=true"}, func(t *testing.T, o options) { assert.True(t, o.cfg.Guard.TLS.Decoder) }},
		{[]string{"--prefiller-tls-insecure-skip-verify"}, func(t *testing.T, o options) { assert.True(t, o.cfg.Guard.TLS.InsecureSkipVerifyPrefiller) }},
		{[]string{"--decoder-tls-insecure-skip-verify"}, func(t *testing.T, o options) { assert.True(t, o.cfg.Guard.TLS.InsecureSkipVerifyDecoder) }},
		{[]string{"--prefiller-use-tls=false", "--enable-tls=prefiller"}, func(t *testing.T, o options) { assert.True(t, o.cfg.Guard.TLS.Prefiller) }},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			o, err := parseFlags(tc.args, io.Discard)
			require.NoError(t, err)
			tc.check(t, o)
		})
	}
}

// TestLLMDFlagsRefused: a value that would turn on a feature not built
// yet, or one llm-d also refuses, exits 2 with one line.
func TestLLMDFlagsRefused(t *testing.T) {
	clearLLMDEnv(t)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--decode-chunk-size=-1"}, "--decode-chunk-size -1 must be >= 0"},
		{[]string{"--ec-connector=ec-nixl", "--on-encoder-failure=retry"}, `--on-encoder-failure must be "error" or "local", got "retry"`},
		{[]string{"--ec-connector=ec-nixl", "--encoder-timeout=0s"}, "--encoder-timeout must be > 0, got 0s"},
		{[]string{"--encoder-max-concurrency=0"}, "--encoder-max-concurrency must be > 0, got 0"},
		{[]string{"--ec-connector=bogus"}, `--ec-connector "bogus" is not one of ec-example, ec-nixl`},
		{[]string{"--enable-p2p-pull", "--kv-connector=shared-storage"}, "--enable-p2p-pull requires --kv-connector=nixlv2"},
		{[]string{"--p2p-connector-port=0"}, "--p2p-connector-port 0 is not a port"},
		{[]string{"--p2p-connector-port=65535", "--data-parallel-size=2"}, "--p2p-connector-port 65535 plus data-parallel rank 1 exceeds 65535"},
		{[]string{"--moriio-write-mode"}, "--moriio-write-mode needs --moriio-local-pod-ip or POD_IP"},
		{[]string{"--moriio-write-mode", "--moriio-local-pod-ip=no-such-host.invalid"}, `MoRI-IO host "no-such-host.invalid" does not resolve`},
		{[]string{"--moriio-parallel-dispatch"}, "--moriio-parallel-dispatch needs --moriio-write-mode"},
		{[]string{"--moriio-remote-hosts=a,b"}, "--moriio-remote-hosts with 2 hosts needs --moriio-dp-size-local > 0"},
		{[]string{"--moriio-decode-hosts=a,b", "--moriio-dp-size=8", "--moriio-dp-size-local=3"}, "--moriio-dp-size 8 is not a multiple of --moriio-dp-size-local 3"},
		{[]string{"--moriio-decode-hosts=a,b,c", "--moriio-dp-size=8", "--moriio-dp-size-local=4"}, "--moriio-decode-hosts names 3 hosts, but --moriio-dp-size / --moriio-dp-size-local is 2"},
		{[]string{"--zap-log-level=0"}, "invalid argument \"0\" for \"--zap-log-level\""},
		{[]string{"--zap-log-level=loud"}, "invalid argument \"loud\" for \"--zap-log-level\""},
		{[]string{"--zap-encoder=yaml"}, "invalid argument \"yaml\" for \"--zap-encoder\""},
		{[]string{"--zap-stacktrace-level=debug"}, "invalid argument \"debug\" for \"--zap-stacktrace-level\""},
		{[]string{"--inference-pool=a/b/c"}, "--inference-pool \"a/b/c\" is not namespace/name or name"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stderr bytes.Buffer
			assert.Equal(t, exitUsage, run(tc.args, io.Discard, &stderr))
			assert.Equal(t, 1, bytes.Count(stderr.Bytes(), []byte("\n")), "one line: %q", stderr.String())
			assert.Contains(t, stderr.String(), tc.want)
		})
	}
}

// TestLLMDEnvDefaults: llm-d's environment variables are the defaults of
// their flags (so a flag, or a configuration file above the defaults,
// wins); a port variable that is not an integer is ignored, as in llm-d.
func TestLLMDEnvDefaults(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		args    []string
		wantErr string
		check   func(t *testing.T, o options)
	}{
		{name: "MOONCAKE_BOOTSTRAP_PORT", env: map[string]string{"MOONCAKE_BOOTSTRAP_PORT": "9100"}, check: func(t *testing.T, o options) { assert.Equal(t, 9100, o.connectorOpts.mooncakeBootstrapPort) }},
		{name: "MOONCAKE_BOOTSTRAP_PORT not an integer", env: map[string]string{"MOONCAKE_BOOTSTRAP_PORT": "abc"}, check: func(t *testing.T, o options) { assert.Equal(t, 8998, o.connectorOpts.mooncakeBootstrapPort) }},
		{name: "MOONCAKE_BOOTSTRAP_PORT out of range", env: map[string]string{"MOONCAKE_BOOTSTRAP_PORT": "70000"}, wantErr: "--mooncake-bootstrap-port 70000 is not a port"},
		{name: "flag beats MOONCAKE_BOOTSTRAP_PORT", env: map[string]string{"MOONCAKE_BOOTSTRAP_PORT": "9100"}, args: []string{"--mooncake-bootstrap-port=9200"}, check: func(t *testing.T, o options) { assert.Equal(t, 9200, o.connectorOpts.mooncakeBootstrapPort) }},
		{name: "P2P_CONNECTOR_PORT", env: map[string]string{"P2P_CONNECTOR_PORT": "7800"}, check: func(t *testing.T, o options) { assert.Equal(t, 7800, o.llmd.p2pConnectorPort) }},
		{name: "P2P_CONNECTOR_PORT not an integer", env: map[string]string{"P2P_CONNECTOR_PORT": "x"}, check: func(t *testing.T, o options) { assert.Equal(t, 7777, o.llmd.p2pConnectorPort) }},
		{name: "flag beats P2P_CONNECTOR_PORT", env: map[string]string{"P2P_CONNECTOR_PORT": "7800"}, args: []string{"--p2p-connector-port=7900"}, check: func(t *testing.T, o options) { assert.Equal(t, 7900, o.llmd.p2pConnectorPort) }},
		{name: "ENABLE_PREFILLER_SAMPLING", env: map[string]string{"ENABLE_PREFILLER_SAMPLING": "true"}, check: func(t *testing.T, o options) { assert.True(t, o.cfg.PrefillerSampling) }},
		{name: "ENABLE_PREFILLER_SAMPLING unreadable", env: map[string]string{"ENABLE_PREFILLER_SAMPLING": "yes please"}, check: func(t *testing.T, o options) { assert.False(t, o.cfg.PrefillerSampling) }},
		{name: "flag beats ENABLE_PREFILLER_SAMPLING", env: map[string]string{"ENABLE_PREFILLER_SAMPLING": "1"}, args: []string{"--enable-prefiller-sampling=false"}, check: func(t *testing.T, o options) { assert.False(t, o.cfg.PrefillerSampling) }},
		{name: "INFERENCE_POOL bare name", env: map[string]string{"INFERENCE_POOL": "my-pool"}, check: func(t *testing.T, o options) { assertPool(t, o, "default", "my-pool") }},
		{name: "POD_IP", env: map[string]string{"POD_IP": "10.1.2.3"}, check: func(t *testing.T, o options) { assert.Equal(t, "10.1.2.3", o.llmd.moriio.localPodIP) }},
		{name: "flag beats POD_IP", env: map[string]string{"POD_IP": "10.1.2.3"}, args: []string{"--moriio-local-pod-ip=10.9.9.9"}, check: func(t *testing.T, o options) { assert.Equal(t, "10.9.9.9", o.llmd.moriio.localPodIP) }},
		{name: "MORIIO_DNS_RESOLVE_TTL_SECONDS", env: map[string]string{"MORIIO_DNS_RESOLVE_TTL_SECONDS": "2.5", "MORIIO_DNS_RESOLVE_TIMEOUT_SECONDS": "1"}, args: []string{"--moriio-write-mode", "--moriio-local-pod-ip=10.0.0.5"}, check: func(t *testing.T, o options) {
			assert.Equal(t, 2500*time.Millisecond, o.cfg.MoriIO.DNSTTL)
			assert.Equal(t, time.Second, o.cfg.MoriIO.DNSTimeout)
		}},
		{name: "MORIIO_DNS_RESOLVE_TTL_SECONDS not positive", env: map[string]string{"MORIIO_DNS_RESOLVE_TTL_SECONDS": "0"}, args: []string{"--moriio-write-mode", "--moriio-local-pod-ip=10.0.0.5"}, wantErr: `MORIIO_DNS_RESOLVE_TTL_SECONDS="0" is not a positive number of seconds`},
		{name: "MORIIO_DNS_SERVER not host:port", env: map[string]string{"MORIIO_DNS_SERVER": "dns"}, args: []string{"--moriio-write-mode", "--moriio-local-pod-ip=10.0.0.5"}, wantErr: `MORIIO_DNS_SERVER="dns" is not host:port`},
		{name: "MORIIO_METRICS_ADDR", env: map[string]string{"MORIIO_METRICS_ADDR": ":9090"}, check: func(t *testing.T, o options) { assert.Equal(t, 9090, o.cfg.MetricsPort) }},
		{name: "flag beats MORIIO_METRICS_ADDR", env: map[string]string{"MORIIO_METRICS_ADDR": ":9090"}, args: []string{"--metrics-port=9191"}, check: func(t *testing.T, o options) { assert.Equal(t, 9191, o.cfg.MetricsPort) }},
		{name: "MORIIO_METRICS_ADDR not an address", env: map[string]string{"MORIIO_METRICS_ADDR": "9090"}, wantErr: `MORIIO_METRICS_ADDR="9090" is not a listen address like :9090`},
		{name: "SGLANG_BOOTSTRAP_PORT", env: map[string]string{"SGLANG_BOOTSTRAP_PORT": "9300"}, check: func(t *testing.T, o options) { assert.Equal(t, 9300, o.connectorOpts.sglangBootstrapPort) }},
		{name: "SGLANG_BOOTSTRAP_PORT not a port (stricter than llm-d)", env: map[string]string{"SGLANG_BOOTSTRAP_PORT": "x"}, wantErr: `SGLANG_BOOTSTRAP_PORT "x" is not a port`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clearLLMDEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			o, err := parseFlags(tc.args, io.Discard)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				return
			}
			require.NoError(t, err)
			tc.check(t, o)
		})
	}
}

// TestLogLevelFlags: --log-level, when given, wins over --zap-log-level
// and --zap-devel, in either order; --zap-log-level wins over --zap-devel.
func TestLogLevelFlags(t *testing.T) {
	tests := []struct {
		args []string
		want zerolog.Level
	}{
		{nil, zerolog.InfoLevel},
		{[]string{"--zap-log-level=info"}, zerolog.InfoLevel},
		{[]string{"--zap-log-level=debug"}, zerolog.DebugLevel},
		{[]string{"--zap-log-level=error"}, zerolog.ErrorLevel},
		{[]string{"--zap-log-level=panic"}, zerolog.PanicLevel},
		{[]string{"--zap-log-level=1"}, zerolog.InfoLevel},
		{[]string{"--zap-log-level=3"}, zerolog.InfoLevel},
		{[]string{"--zap-log-level=4"}, zerolog.DebugLevel},
		{[]string{"--zap-log-level=5"}, zerolog.TraceLevel},
		{[]string{"--zap-log-level=9"}, zerolog.TraceLevel},
		{[]string{"--zap-devel"}, zerolog.DebugLevel},
		{[]string{"--zap-devel=false"}, zerolog.InfoLevel},
		{[]string{"--zap-devel", "--zap-log-level=error"}, zerolog.ErrorLevel},
		{[]string{"--zap-log-level=error", "--zap-devel"}, zerolog.ErrorLevel},
		{[]string{"--log-level=warn", "--zap-log-level=debug"}, zerolog.WarnLevel},
		{[]string{"--zap-log-level=debug", "--log-level=warn"}, zerolog.WarnLevel},
		{[]string{"--zap-devel", "--log-level=info"}, zerolog.InfoLevel},
		{[]string{"--log-level=trace"}, zerolog.TraceLevel},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			o, err := parseFlags(tc.args, io.Discard)
			require.NoError(t, err)
			assert.Equal(t, tc.want, o.logLevel)
		})
	}
}
