package harness

import (
	"testing"
	"time"
)

// Engine is a running engine-sim process.
type Engine struct {
	*Proc
	// Port is the HTTP port; KVPort the NIXL-style KV side channel;
	// BootstrapPort the SGLang bootstrap port.
	Port, KVPort, BootstrapPort int
}

// URL returns the engine's base URL.
func (e *Engine) URL() string { return URL(e.Port) }

// HostPort returns 127.0.0.1:Port, the form x-prefiller-host-port takes.
func (e *Engine) HostPort() string { return HostPort(e.Port) }

// Metric scrapes the engine's /metrics and returns Value(name, labels).
func (e *Engine) Metric(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	return Metric(t, e.URL()+"/metrics", name, labels)
}

// StartEngineSim builds and starts cmd/engine-sim with the given role on free
// ports and waits for /health. Extra flags are appended after the defaults, so
// they override them.
func StartEngineSim(t testing.TB, role string, extra ...string) *Engine {
	t.Helper()
	e := &Engine{Port: FreePort(t), KVPort: FreePort(t), BootstrapPort: FreePort(t)}
	args := []string{
		"--role", role,
		"--port", itoa(e.Port),
		"--kv-port", itoa(e.KVPort),
		"--bootstrap-port", itoa(e.BootstrapPort),
		"--model", "sim-model",
		"--prefill-us-per-token", "20",
		"--decode-us-per-token", "200",
		"--log-level", "debug",
	}
	args = append(args, extra...)
	e.Proc = Start(t, Binary(t, "engine-sim"), args...)
	e.WaitHTTP(t, e.URL()+"/health", 30*time.Second)
	return e
}
