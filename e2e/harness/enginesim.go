package harness

import (
	"encoding/json"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pd-sidecar/pd-sidecar/e2e/enginesim"
)

// Engine is a running engine-sim process.
type Engine struct {
	*Proc
	// Port is the HTTP port; KVPort the NIXL-style KV side channel;
	// BootstrapPort the SGLang bootstrap port; P2PPort the OffloadingConnector
	// P2P listener (remote_prefiller and remote_kv_source pulls).
	Port, KVPort, BootstrapPort, P2PPort int
	// Host is the address it listens on: 127.0.0.1, or the --host a test
	// gave (another loopback address stands for another pod).
	Host string
}

// URL returns the engine's base URL.
func (e *Engine) URL() string { return "http://" + e.HostPort() }

// HostPort returns Host:Port, the form x-prefiller-host-port takes.
func (e *Engine) HostPort() string { return net.JoinHostPort(e.Host, strconv.Itoa(e.Port)) }

// Metric scrapes the engine's /metrics and returns Value(name, labels).
func (e *Engine) Metric(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	return Metric(t, e.URL()+"/metrics", name, labels)
}

// WireShapeEnv names the environment variable that sets every engine-sim's
// --wire-shape (make test-wire-shapes runs the P/D e2e tests on the oldest
// shape still supported this way); a test's own flag wins.
const WireShapeEnv = "PD_E2E_WIRE_SHAPE"

// WireShape is the --wire-shape the harness's engine-sims run with: the
// WireShapeEnv's, else engine-sim's default.
func WireShape() string {
	if shape := os.Getenv(WireShapeEnv); shape != "" {
		return shape
	}
	return enginesim.DefaultWireShape
}

// StartEngineSim builds and starts cmd/engine-sim with the given role on free
// ports and waits for /health. Extra flags are appended after the defaults, so
// they override them; a port flag among them (--port, --kv-port,
// --bootstrap-port, --p2p-port, as "--flag N" or "--flag=N") sets that port,
// e.g. "--p2p-port", N for data-parallel rank r's engine on base+r. With
// "--p2p-port 0" the engine picks the port, read from its startup line.
func StartEngineSim(t testing.TB, role string, extra ...string) *Engine {
	t.Helper()
	host := "127.0.0.1"
	if h, ok := flagValue(extra, "--host"); ok {
		host = h
	}
	// A lost port is worth a new try when the harness chose at least one.
	chosen := false
	for _, f := range []string{"--port", "--kv-port", "--bootstrap-port", "--p2p-port"} {
		if _, ok := flagValue(extra, f); !ok {
			chosen = true
		}
	}
	var e *Engine
	proc := startOnFreePorts(t, chosen, func() (*Proc, string) {
		e = &Engine{Host: host}
		ports := []struct {
			flag string
			port *int
		}{{"--port", &e.Port}, {"--kv-port", &e.KVPort}, {"--bootstrap-port", &e.BootstrapPort}, {"--p2p-port", &e.P2PPort}}
		args := []string{"--role", role}
		for _, p := range ports {
			v, ok := flagValue(extra, p.flag)
			if !ok {
				*p.port = FreePort(t)
				args = append(args, p.flag, itoa(*p.port))
				continue
			}
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("harness: %s %q is not a port", p.flag, v)
			}
			*p.port = n
		}
		args = append(args,
			"--model", "sim-model",
			"--prefill-us-per-token", "20",
			"--decode-us-per-token", "200",
			"--log-level", "debug",
		)
		if shape := os.Getenv(WireShapeEnv); shape != "" {
			args = append(args, "--wire-shape", shape) // a test's own --wire-shape, later, wins
		}
		args = append(args, extra...)
		return Start(t, Binary(t, "engine-sim"), args...), e.URL() + "/health"
	})
	e.Proc = proc
	if e.P2PPort == 0 {
		e.P2PPort = e.announcedPort(t, "p2p")
	}
	return e
}

// flagValue returns the last value given to flag in args.
func flagValue(args []string, flag string) (string, bool) {
	v, ok := "", false
	for i, a := range args {
		switch {
		case a == flag && i+1 < len(args):
			v, ok = args[i+1], true
		case strings.HasPrefix(a, flag+"="):
			v, ok = strings.TrimPrefix(a, flag+"="), true
		}
	}
	return v, ok
}

// announcedPort reads the port of listener key ("kv", "bootstrap", "p2p")
// from the engine's startup line ("engine-sim serving").
func (e *Engine) announcedPort(t testing.TB, key string) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, line := range strings.Split(e.Output(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) != nil || m["message"] != "engine-sim serving" {
				continue
			}
			addr, _ := m[key].(string)
			_, port, err := net.SplitHostPort(addr)
			if n, perr := strconv.Atoi(port); err == nil && perr == nil {
				return n
			}
			t.Fatalf("harness: engine-sim announced %s %q", key, addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("harness: engine-sim did not announce its %s port:\n%s", key, e.Output())
	return 0
}
