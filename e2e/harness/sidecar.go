package harness

import (
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
)

// Sidecar is a running pd-sidecar process.
type Sidecar struct {
	*Proc
	// Port is the proxy port of data-parallel rank 0 (rank r: Port+r).
	Port int
}

// URL returns the sidecar's base URL (rank 0).
func (s *Sidecar) URL() string { return URL(s.Port) }

// Metric scrapes the sidecar's /metrics and returns Value(name, labels).
func (s *Sidecar) Metric(t testing.TB, name string, labels map[string]string) float64 {
	t.Helper()
	return Metric(t, s.URL()+"/metrics", name, labels)
}

// StartSidecar builds and starts cmd/pd-sidecar in front of the engine on
// modelServerPort, on free ports (room for four data-parallel ranks), and
// waits for /health. Extra flags come after the defaults, so they override
// them.
func StartSidecar(t testing.TB, modelServerPort int, extra ...string) *Sidecar {
	t.Helper()
	s := &Sidecar{}
	_, fixed := flagValue(extra, "--port")
	s.Proc = startOnFreePorts(t, !fixed, func() (*Proc, string) {
		s.Port = FreePorts(t, 4)
		args := []string{
			"--port", itoa(s.Port),
			"--model-server-port", itoa(modelServerPort),
			"--prefill-timeout", "2s",
			"--connect-timeout", "1s",
			"--shutdown-grace", "10s",
			"--log-level", "debug",
			// The engine-version probe's GETs would be requests of their own
			// to the fake and scripted engines the tests count; the tests of
			// the probe turn it on.
			"--engine-info-interval", "0",
		}
		args = append(args, extra...)
		if fixed {
			v, _ := flagValue(extra, "--port")
			s.Port, _ = strconv.Atoi(v)
		}
		return Start(t, Binary(t, "pd-sidecar"), args...), s.URL() + "/health"
	})
	return s
}

// FreePorts returns the first of n consecutive TCP ports on 127.0.0.1 that
// were all free a moment ago. The run is drawn below Linux's ephemeral range
// (32768 and up), where FreePort's ports come from, so the two never clash.
func FreePorts(t testing.TB, n int) int {
	t.Helper()
	for try := 0; try < 200; try++ {
		base := 20000 + rand.IntN(12000-n)
		if reserveRun(base, n) {
			forgetPorts(t, base, n)
			return base
		}
	}
	t.Fatalf("harness: no %d consecutive free ports", n)
	return 0
}

// reserveRun marks ports first..first+n-1 as handed out if each is free now
// and no test still running was handed it.
func reserveRun(first, n int) bool {
	portMu.Lock()
	defer portMu.Unlock()
	for p := first; p < first+n; p++ {
		if handedOut[p] {
			return false
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			return false
		}
		_ = l.Close()
	}
	for p := first; p < first+n; p++ {
		handedOut[p] = true
	}
	return true
}
