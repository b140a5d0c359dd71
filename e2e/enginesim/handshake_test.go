package enginesim

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestKVHandshakeOncePerPrefiller: a decode engine's first pull from a
// prefiller engine waits --kv-handshake-delay, concurrent first pulls
// from it share that one handshake, later pulls from it do not wait, and
// another prefiller engine has a handshake of its own.
func TestKVHandshakeOncePerPrefiller(t *testing.T) {
	// Long beside a decode's own work and the moments between the three
	// concurrent ones' starts on a loaded machine: a wait for it, or none,
	// is plain on any machine.
	const delay = 3 * time.Second
	p1 := startSim(t, RolePrefill, nil)
	p2 := startSim(t, RolePrefill, nil)
	d := startSim(t, RoleDecode, func(c *Config) { c.KVHandshakeDelay = delay })

	decode := func(p *testSim, prompt string) time.Duration {
		kv := nixlPrefill(t, p, prompt)
		start := time.Now()
		a := post(t, d.url+"/v1/completions", decodeBody(prompt, kv, ""))
		took := time.Since(start)
		require.Equal(t, 200, a.status, "%s", a.body)
		return took
	}

	var wg sync.WaitGroup
	took := make([]time.Duration, 3)
	for i := range took {
		wg.Go(func() { took[i] = decode(p1, longPrompt(40+i)) })
	}
	wg.Wait()
	for i, d := range took {
		// The three start within moments of each other and wait for
		// the one handshake the first of them started.
		assert.Greater(t, d, delay/2, "first decode %d from p1 waits for the handshake", i)
	}
	assert.Equal(t, 1.0, d.metric(t, "sim_kv_handshakes_total"), "one handshake for concurrent first pulls")

	assert.Less(t, decode(p1, longPrompt(60)), delay, "p1 is connected: no wait")
	assert.Equal(t, 1.0, d.metric(t, "sim_kv_handshakes_total"))

	assert.GreaterOrEqual(t, decode(p2, longPrompt(61)), delay, "p2 needs a handshake of its own")
	assert.Equal(t, 2.0, d.metric(t, "sim_kv_handshakes_total"))
	assert.Equal(t, 5.0, d.metric(t, "sim_remote_kv_decodes_total"))
}

// TestKVHandshakeWithoutDelay: handshakes are counted with no delay too,
// and a local request is none.
func TestKVHandshakeWithoutDelay(t *testing.T) {
	p := startSim(t, RolePrefill, nil)
	d := startSim(t, RoleDecode, nil)
	local := post(t, d.url+"/v1/completions", `{"model":"sim-model","prompt":"hello there","max_tokens":2}`)
	require.Equal(t, 200, local.status)
	assert.Equal(t, 0.0, d.metric(t, "sim_kv_handshakes_total"))
	for i := range 2 {
		prompt := longPrompt(30 + i)
		kv := nixlPrefill(t, p, prompt)
		a := post(t, d.url+"/v1/completions", decodeBody(prompt, kv, ""))
		require.Equal(t, 200, a.status, "%s", a.body)
	}
	assert.Equal(t, 1.0, d.metric(t, "sim_kv_handshakes_total"))
}

func TestKVHandshakeDelayValidated(t *testing.T) {
	c := DefaultConfig()
	c.KVHandshakeDelay = -time.Second
	require.ErrorIs(t, c.Validate(), ErrInvalidConfig)
}
