package main

import (
	"bytes"
	"io"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/proxy"
)

func TestParseFlagsDefaults(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, proxy.DefaultConfig(), o.cfg)
	assert.Equal(t, "nixlv2", o.connector)
	assert.Equal(t, zerolog.InfoLevel, o.logLevel)
}

func TestParseFlagsDropIn(t *testing.T) {
	o, err := parseFlags([]string{
		"--port", "9000", "--vllm-port", "9200", "--kv-connector", "nixlv2",
		"--data-parallel-size", "2", "--enable-prefiller-sampling", "--prefill-max-retries", "3",
		"--prefill-timeout", "5s", "--connect-timeout", "250ms", "--prefill-fallback=false",
		"--on-kv-load-failure", "error", "--decode-tp-size", "4", "--max-request-body-bytes", "1024",
		"--shutdown-grace", "1s", "--metrics-port", "9100", "--log-level", "debug",
	}, io.Discard)
	require.NoError(t, err)
	c := o.cfg
	assert.Equal(t, 9000, c.Port)
	assert.Equal(t, 9200, c.ModelServerPort, "--vllm-port is an alias")
	assert.Equal(t, 2, c.DataParallelSize)
	assert.True(t, c.PrefillerSampling)
	assert.Equal(t, 3, c.PrefillMaxRetries)
	assert.Equal(t, 5*time.Second, c.PrefillTimeout)
	assert.Equal(t, 250*time.Millisecond, c.ConnectTimeout)
	assert.False(t, c.PrefillFallback)
	assert.Equal(t, proxy.KVFailError, c.OnKVLoadFailure)
	assert.Equal(t, 4, c.DecodeTPSize)
	assert.Equal(t, 1024, c.MaxRequestBodyBytes)
	assert.Equal(t, time.Second, c.ShutdownGrace)
	assert.Equal(t, 9100, c.MetricsPort)
	assert.Equal(t, zerolog.DebugLevel, o.logLevel)
}

func TestRunInvalidConfigExits2WithOneLine(t *testing.T) {
	for _, args := range [][]string{
		{"--port", "-1"},
		{"--kv-connector", "bogus"},
		{"--kv-connector", "sglang", "--sglang-bootstrap-port", "0"},
		{"--log-level", "loud"},
		{"--bogus"},
		{"extra-arg"},
	} {
		var stderr bytes.Buffer
		code := run(args, io.Discard, &stderr)
		assert.Equal(t, 2, code, "%v", args)
		assert.Equal(t, 1, bytes.Count(stderr.Bytes(), []byte("\n")), "one line for %v: %q", args, stderr.String())
	}
}

func TestRunHelpExits0(t *testing.T) {
	var stderr bytes.Buffer
	assert.Equal(t, 0, run([]string{"--help"}, io.Discard, &stderr))
	assert.Contains(t, stderr.String(), "--model-server-port")
	assert.NotContains(t, stderr.String(), "vllm-port", "deprecated alias hidden")
}
