package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/proxy"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
)

func TestParseFlagsDefaults(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	require.NoError(t, err)
	want := proxy.DefaultConfig()
	// Derived from the memory limit of the container the test runs in.
	want.Guard.MaxBufferedBytes = bufferBudget(os.ReadFile, want.MaxRequestBodyBytes)
	assert.Equal(t, want, o.cfg)
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
	assert.Equal(t, core.KVFailError, c.OnKVLoadFailure)
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

// TestRunHelpAndVersion: --help (of every command) and --version print on
// stdout and exit 0; the main help names the subcommands.
func TestRunHelpAndVersion(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--help"}, []string{"--model-server-port", "pd-sidecar status", "pd-sidecar kv-probe", "pd-sidecar --version"}},
		{[]string{"status", "--help"}, []string{"Usage: pd-sidecar status", "--url"}},
		{[]string{"kv-probe", "--help"}, []string{"Usage: pd-sidecar kv-probe", "--peer"}},
		{[]string{"--version"}, []string{"pd-sidecar ", "commit ", "built with go"}},
		{[]string{"version"}, []string{"pd-sidecar ", "commit "}},
	} {
		var stdout, stderr bytes.Buffer
		assert.Equal(t, 0, run(tc.args, &stdout, &stderr), "%v", tc.args)
		assert.Empty(t, stderr.String(), "%v", tc.args)
		for _, w := range tc.want {
			assert.Contains(t, stdout.String(), w, "%v", tc.args)
		}
		assert.NotContains(t, stdout.String(), "vllm-port", "deprecated alias hidden")
	}
}

func TestBufferBudget(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name    string
		limit   string // memory.max; "" : no such file
		maxBody int
		want    int64
	}{
		{"no cgroup v2", "", 32 * mib, 512 * mib},
		{"no limit", "max\n", 32 * mib, 512 * mib},
		{"large limit: capped", "17179869184\n", 32 * mib, 512 * mib},
		{"1 GiB: a quarter", "1073741824\n", 32 * mib, 256 * mib},
		{"small limit: at least the largest body", "67108864\n", 32 * mib, 32 * mib},
		{"garbage", "lots\n", 32 * mib, 512 * mib},
	} {
		t.Run(tc.name, func(t *testing.T) {
			read := func(path string) ([]byte, error) {
				assert.Equal(t, cgroupMemoryMax, path)
				if tc.limit == "" {
					return nil, os.ErrNotExist
				}
				return []byte(tc.limit), nil
			}
			assert.Equal(t, tc.want, bufferBudget(read, tc.maxBody))
		})
	}
}

func TestMaxBufferedBytesFlag(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want int64
		err  string
	}{
		{"given", []string{"--max-buffered-bytes", "67108864"}, 64 << 20, ""},
		{"derived", nil, 256 << 20, ""},
		{"negative", []string{"--max-buffered-bytes", "-1"}, 0, "--max-buffered-bytes must be >= 0"},
		{"below the largest body", []string{"--max-buffered-bytes", "1024"}, 0, "must be >= --max-request-body-bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlagsWith(tc.args, func(string) ([]byte, error) { return []byte("1073741824"), nil })
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, o.cfg.Guard.MaxBufferedBytes)
		})
	}
	_, err := parseFlagsWith(nil, func(string) ([]byte, error) { return nil, errors.New("unreadable") })
	require.NoError(t, err, "an unreadable cgroup file keeps the default")
}

// parseFlagsWith parses the guard flags as parseFlags does, with read as
// the cgroup file reader.
func parseFlagsWith(args []string, read func(string) ([]byte, error)) (options, error) {
	o := options{cfg: proxy.DefaultConfig()}
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addGuardFlags(fs, &o)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.guard.readFile = read
	if err := o.guard.apply(&o.cfg); err != nil {
		return o, err
	}
	return o, o.cfg.Validate()
}

// POD_IP names this pod's data-parallel ranks in x-data-parallel-host-port,
// as in llm-d (no flag: the downward API sets it).
func TestPodIPFromEnvironment(t *testing.T) {
	t.Setenv("POD_IP", "10.1.2.3")
	o, err := parseFlags(nil, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "10.1.2.3", o.cfg.PodIP)
}
