package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestConfigurationPrecedence: command line > configuration > environment
// > built-in default, for flags of each type, inline and from a file.
func TestConfigurationPrecedence(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sidecar.yaml")
	require.NoError(t, os.WriteFile(file, []byte(`
port: 9000
inference-pool: yaml-ns/yaml-pool
sglang-bootstrap-port: 7001
enable-prefiller-sampling: true
prefill-retry-backoff: 300ms
enable-tls: [prefiller, decoder]
max-upstream-answer-bytes: 4294967296
`), 0o600))
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want func(t *testing.T, o options)
	}{
		{"built-in defaults", nil, nil, func(t *testing.T, o options) {
			assert.Equal(t, 8000, o.cfg.Port)
			assert.Empty(t, o.guard.pool)
			assert.Equal(t, 8998, o.connectorOpts.sglangBootstrapPort)
			assert.False(t, o.cfg.PrefillerSampling)
			assert.Equal(t, 200*time.Millisecond, o.cfg.PrefillRetryBackoff)
			assert.Empty(t, o.guard.enableTLS)
		}},
		{"environment over the default", map[string]string{"INFERENCE_POOL": "env-ns/env-pool", "SGLANG_BOOTSTRAP_PORT": "7002"}, nil,
			func(t *testing.T, o options) {
				assert.Equal(t, "env-ns/env-pool", o.guard.pool)
				assert.Equal(t, 7002, o.connectorOpts.sglangBootstrapPort)
			}},
		{"file over the environment", map[string]string{"INFERENCE_POOL": "env-ns/env-pool", "SGLANG_BOOTSTRAP_PORT": "7002"},
			[]string{"--configuration-file", file}, func(t *testing.T, o options) {
				assert.Equal(t, 9000, o.cfg.Port)
				assert.Equal(t, "yaml-ns/yaml-pool", o.guard.pool)
				assert.Equal(t, 7001, o.connectorOpts.sglangBootstrapPort)
				assert.True(t, o.cfg.PrefillerSampling)
				assert.Equal(t, 300*time.Millisecond, o.cfg.PrefillRetryBackoff)
				assert.Equal(t, []string{"prefiller", "decoder"}, o.guard.enableTLS)
				assert.Equal(t, int64(4294967296), o.cfg.MaxUpstreamAnswerBytes, "an int64 past 2^32, exactly")
			}},
		{"command line over the file", map[string]string{"INFERENCE_POOL": "env-ns/env-pool"},
			[]string{"--port=9100", "--inference-pool=cli-ns/cli-pool", "--sglang-bootstrap-port=7003",
				"--enable-prefiller-sampling=false", "--prefill-retry-backoff=1s", "--enable-tls=decoder",
				"--configuration-file=" + file}, func(t *testing.T, o options) {
				assert.Equal(t, 9100, o.cfg.Port)
				assert.Equal(t, "cli-ns/cli-pool", o.guard.pool)
				assert.Equal(t, 7003, o.connectorOpts.sglangBootstrapPort)
				assert.False(t, o.cfg.PrefillerSampling, "an explicit false on the command line wins")
				assert.Equal(t, time.Second, o.cfg.PrefillRetryBackoff)
				assert.Equal(t, []string{"decoder"}, o.guard.enableTLS)
				assert.Equal(t, int64(4294967296), o.cfg.MaxUpstreamAnswerBytes, "keys not on the command line still apply")
			}},
		{"inline JSON", nil, []string{`--configuration={"port": 9200, "enable-prefiller-sampling": true, "prefill-retry-backoff": "2s", "tls-insecure-skip-verify": ["prefiller"]}`},
			func(t *testing.T, o options) {
				assert.Equal(t, 9200, o.cfg.Port)
				assert.True(t, o.cfg.PrefillerSampling)
				assert.Equal(t, 2*time.Second, o.cfg.PrefillRetryBackoff)
				assert.Equal(t, []string{"prefiller"}, o.guard.skipVerify)
			}},
		{"inline YAML, flow style", nil, []string{"--configuration", "{port: 9300, kv-connector: sglang, data-parallel-size: 2}"},
			func(t *testing.T, o options) {
				assert.Equal(t, 9300, o.cfg.Port)
				assert.Equal(t, "sglang", o.connector)
				assert.Equal(t, 2, o.cfg.DataParallelSize)
			}},
		{"explicit false and zero apply", nil, []string{"--configuration", "{prefill-fallback: false, prefill-max-retries: 0, decode-first-byte-timeout: 0s}"},
			func(t *testing.T, o options) {
				assert.False(t, o.cfg.PrefillFallback)
				assert.Zero(t, o.cfg.PrefillMaxRetries)
				assert.Zero(t, o.cfg.DecodeFirstByteTimeout)
			}},
		{"an empty list clears a list", nil, []string{"--configuration", "enable-tls: []"},
			func(t *testing.T, o options) { assert.Empty(t, o.guard.enableTLS) }},
		{"a key without a value keeps the default", nil, []string{"--configuration", "port:"},
			func(t *testing.T, o options) { assert.Equal(t, 8000, o.cfg.Port) }},
		{"an empty configuration", nil, []string{"--configuration-file", writeTemp(t, "")},
			func(t *testing.T, o options) { assert.Equal(t, 8000, o.cfg.Port) }},
		{"vllm-port on the command line beats the file's model-server-port", nil,
			[]string{"--vllm-port=9201", "--configuration", "model-server-port: 9202"},
			func(t *testing.T, o options) { assert.Equal(t, 9201, o.cfg.ModelServerPort) }},
		{"model-server-port beats vllm-port in one file", nil,
			[]string{"--configuration", "{vllm-port: 9203, model-server-port: 9204}"},
			func(t *testing.T, o options) { assert.Equal(t, 9204, o.cfg.ModelServerPort) }},
		{"vllm-port alone in a file", nil, []string{"--configuration", "vllm-port: 9205"},
			func(t *testing.T, o options) { assert.Equal(t, 9205, o.cfg.ModelServerPort) }},
		{"the log level", nil, []string{"--configuration", "log-level: debug"},
			func(t *testing.T, o options) { assert.Equal(t, "debug", o.logLevel.String()) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"INFERENCE_POOL", "SGLANG_BOOTSTRAP_PORT"} {
				t.Setenv(k, tc.env[k])
			}
			o, err := parseFlags(tc.args, io.Discard)
			require.NoError(t, err)
			tc.want(t, o)
		})
	}
}

// TestConfigurationInvalidExits2: a bad configuration is one line on
// stderr naming what is wrong, and exit code 2.
func TestConfigurationInvalidExits2(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown key", []string{"--configuration", "{port: 9000, bogus-key: 1}"}, `unknown key "bogus-key"`},
		{"a configuration naming a file", []string{"--configuration", "configuration-file: /x.yaml"}, `unknown key "configuration-file"`},
		{"a configuration naming a configuration", []string{"--configuration", `configuration: "{}"`}, `unknown key "configuration"`},
		{"both flags", []string{"--configuration", "port: 1", "--configuration-file", "/x.yaml"}, "mutually exclusive"},
		{"missing file", []string{"--configuration-file", "/nonexistent/sidecar.yaml"}, "/nonexistent/sidecar.yaml"},
		{"not YAML", []string{"--configuration", "port: [1"}, "not valid YAML or JSON"},
		{"duplicate key", []string{"--configuration", "port: 1\nport: 2"}, "not valid YAML or JSON"},
		{"not a mapping", []string{"--configuration", "[port, 9000]"}, "not a mapping"},
		{"string for an int", []string{"--configuration", `port: "9000"`}, `key "port": want an integer`},
		{"fraction for an int", []string{"--configuration", "port: 9000.5"}, `key "port": want an integer`},
		{"string for a bool", []string{"--configuration", `enable-prefiller-sampling: "true"`}, `key "enable-prefiller-sampling": want true or false`},
		{"number for a duration", []string{"--configuration", "prefill-retry-backoff: 300"}, `key "prefill-retry-backoff": want a string`},
		{"bad duration", []string{"--configuration", "prefill-retry-backoff: soon"}, `key "prefill-retry-backoff"`},
		{"string for a list", []string{"--configuration", "enable-tls: prefiller"}, `key "enable-tls": want a list`},
		{"mapping in a list", []string{"--configuration", "enable-tls: [{a: b}]"}, `key "enable-tls": item 0`},
		{"bad value, checked as on the command line", []string{"--configuration", "kv-connector: bogus"}, `--kv-connector "bogus" is not supported`},
		{"bad list item, checked as on the command line", []string{"--configuration", "enable-tls: [encoderr]"}, `--enable-tls "encoderr"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			code := run(tc.args, io.Discard, &stderr)
			assert.Equal(t, exitUsage, code)
			assert.Equal(t, 1, strings.Count(stderr.String(), "\n"), "one line: %q", stderr.String())
			assert.Contains(t, stderr.String(), tc.want)
		})
	}
}

// llmdKeys are llm-d's 23 configuration keys (llm-d-router v0.10's options.go).
var llmdKeys = []string{
	"port", "model-server-port", "vllm-port", "mooncake-bootstrap-port", "p2p-connector-port",
	"data-parallel-size", "kv-connector", "ec-connector", "enable-ssrf-protection",
	"enable-prefiller-sampling", "enable-p2p-pull", "secure-proxy", "cert-path", "enable-tls",
	"tls-insecure-skip-verify", "inference-pool", "pool-group", "max-idle-conns-per-host",
	"prefill-max-retries", "prefill-retry-backoff", "decode-chunk-size", "tracing", "metrics-port",
}

// usageLine is a flag's line in --help: name, "[=true|false]" for a
// bool, else its type, and its default.
var usageLine = regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9][a-z0-9-]*)(\[=true\|false\])?(?: ([a-zA-Z0-9]+))?\s{2,}.*?(?:\(default (.*)\))?$`)

// TestConfigurationEveryKey: every flag --help lists, and each of
// llm-d's keys this build has, is a configuration key, and setting it in a
// configuration does exactly what the same value on the command line does.
// The keys are read from the flag set at test time, so flags added later
// are covered too.
func TestConfigurationEveryKey(t *testing.T) {
	t.Setenv("INFERENCE_POOL", "")
	t.Setenv("SGLANG_BOOTSTRAP_PORT", "")
	var usage bytes.Buffer
	_, err := parseFlags([]string{"--help"}, &usage)
	require.ErrorIs(t, err, errHelp)
	type key struct{ typ, def string }
	keys := map[string]key{}
	for _, m := range usageLine.FindAllStringSubmatch(usage.String(), -1) {
		if !notConfigKeys[m[1]] {
			typ := m[3]
			if m[2] != "" {
				typ = "bool"
			}
			keys[m[1]] = key{typ, strings.Trim(m[4], `"`)}
		}
	}
	require.Greater(t, len(keys), 30, "parsed --help:\n%s", usage.String())
	// llm-d's keys hidden from --help (deprecated aliases).
	for _, k := range llmdKeys {
		if _, ok := keys[k]; ok {
			continue
		}
		_, err := parseFlags([]string{"--" + k + "=8300"}, io.Discard)
		require.NoError(t, err, "llm-d's key %s is a flag", k)
		keys[k] = key{"int", "8200"}
	}
	defaults, defErr := parseFlags(nil, io.Discard)
	require.NoError(t, defErr)
	for name, k := range keys {
		t.Run(name, func(t *testing.T) {
			cli, yaml := valuesFor(k.typ, k.def)
			fromCLI, cliErr := parseFlags([]string{"--" + name + "=" + cli}, io.Discard)
			fromYAML, yamlErr := parseFlags([]string{"--configuration", name + ": " + yaml}, io.Discard)
			if cliErr != nil {
				require.Error(t, yamlErr, "--%s=%s fails (%v); so must %s: %s", name, cli, cliErr, name, yaml)
				assert.NotContains(t, yamlErr.Error(), "unknown key")
				if !strings.Contains(cliErr.Error(), "invalid argument") { // not pflag's own parse error
					assert.Equal(t, cliErr.Error(), yamlErr.Error(), "the same check on the merged value")
				}
				return
			}
			require.NoError(t, yamlErr, "--%s=%s is fine; %s: %s must be too", name, cli, name, yaml)
			assert.True(t, sameOptions(fromCLI, fromYAML), "%s: %s does what --%s=%s does:\n%+v\n%+v", name, yaml, name, cli, fromCLI, fromYAML)
			if sameOptions(defaults, fromCLI) { // accepted and stored nowhere (a flag for a feature to come)
				t.Logf("--%s=%s leaves the parsed options as they were", name, cli)
			}
		})
	}
}

// valuesFor returns a value other than def for a flag of type typ (as
// --help names it; "bool" for a bool), in command-line and YAML syntax.
func valuesFor(typ, def string) (cli, yaml string) {
	switch typ {
	case "bool":
		if def == "true" {
			return "false", "false"
		}
		return "true", "true"
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		n, _ := strconv.ParseInt(def, 10, 64)
		v := strconv.FormatInt(n+1, 10)
		return v, v
	case "float32", "float64":
		return "0.5", "0.5"
	case "duration":
		d, _ := time.ParseDuration(def)
		v := (d + 1500*time.Millisecond).String()
		return v, `"` + v + `"`
	case "strings", "stringArray":
		return "prefiller,decoder", "[prefiller, decoder]"
	}
	return "x-" + def, `"x-` + def + `"`
}

func writeTemp(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.yaml")
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// TestConfigurationBeatsEnvironment: for each environment variable llm-d
// reads as a flag default, a configuration key beats it (an explicit false
// included).
func TestConfigurationBeatsEnvironment(t *testing.T) {
	tests := []struct {
		env, flag, envValue, yamlValue string
	}{
		{"INFERENCE_POOL", "inference-pool", "env-ns/env-pool", "yaml-ns/yaml-pool"},
		{"SGLANG_BOOTSTRAP_PORT", "sglang-bootstrap-port", "7002", "7001"},
		{"MOONCAKE_BOOTSTRAP_PORT", "mooncake-bootstrap-port", "7003", "7004"},
		{"P2P_CONNECTOR_PORT", "p2p-connector-port", "7005", "7006"},
		{"ENABLE_PREFILLER_SAMPLING", "enable-prefiller-sampling", "true", "false"},
		{"POD_IP", "moriio-local-pod-ip", "10.0.0.1", "10.0.0.2"},
	}
	for _, tc := range tests {
		t.Run(tc.env, func(t *testing.T) {
			t.Setenv(tc.env, tc.envValue)
			fromEnv, err := parseFlags(nil, io.Discard)
			require.NoError(t, err)
			asFlag, err := parseFlags([]string{"--" + tc.flag + "=" + tc.envValue}, io.Discard)
			require.NoError(t, err)
			require.True(t, sameOptions(asFlag, fromEnv), "%s is --%s's default", tc.env, tc.flag)
			fromYAML, err := parseFlags([]string{"--configuration", tc.flag + ": " + tc.yamlValue}, io.Discard)
			require.NoError(t, err)
			asFlag, err = parseFlags([]string{"--" + tc.flag + "=" + tc.yamlValue}, io.Discard)
			require.NoError(t, err)
			assert.True(t, sameOptions(asFlag, fromYAML), "the configuration's %s beats %s", tc.flag, tc.env)
			assert.False(t, sameOptions(fromEnv, fromYAML))
		})
	}
}

// sameOptions compares two parse results deeply, as reflect.DeepEqual
// does, except that functions (a reader, a clock) count as equal when both
// are set or both nil.
func sameOptions(a, b options) bool {
	return sameValue(reflect.ValueOf(a), reflect.ValueOf(b))
}

func sameValue(a, b reflect.Value) bool {
	if a.Kind() != b.Kind() || a.Type() != b.Type() {
		return false
	}
	switch a.Kind() {
	case reflect.Func:
		return a.IsNil() == b.IsNil()
	case reflect.Pointer, reflect.Interface:
		if a.IsNil() || b.IsNil() {
			return a.IsNil() == b.IsNil()
		}
		return sameValue(a.Elem(), b.Elem())
	case reflect.Struct:
		for i := range a.NumField() {
			if !sameValue(a.Field(i), b.Field(i)) {
				return false
			}
		}
		return true
	case reflect.Slice, reflect.Array:
		if a.Len() != b.Len() {
			return false
		}
		for i := range a.Len() {
			if !sameValue(a.Index(i), b.Index(i)) {
				return false
			}
		}
		return true
	case reflect.Map:
		if a.Len() != b.Len() {
			return false
		}
		for it := a.MapRange(); it.Next(); {
			bv := b.MapIndex(it.Key())
			if !bv.IsValid() || !sameValue(it.Value(), bv) {
				return false
			}
		}
		return true
	case reflect.Bool:
		return a.Bool() == b.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return a.Int() == b.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return a.Uint() == b.Uint()
	case reflect.Float32, reflect.Float64:
		return a.Float() == b.Float()
	case reflect.String:
		return a.String() == b.String()
	}
	return a.IsZero() && b.IsZero() // channels, unsafe pointers: only both unset
}

// TestConfigurationMarksFlagsSet: a flag the configuration sets counts as
// set (so code that falls back on an environment variable when a flag is
// not set sees the file's value), and list items keep their commas.
func TestConfigurationMarksFlagsSet(t *testing.T) {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	a := fs.String("a", "", "")
	l := fs.StringSlice("l", nil, "")
	fs.Int("n", 0, "")
	require.NoError(t, parseWithConfiguration(fs, []string{"--configuration", `{a: x, l: ["p,q", r]}`}, nil))
	assert.Equal(t, "x", *a)
	assert.Equal(t, []string{"p,q", "r"}, *l)
	assert.True(t, fs.Changed("a"))
	assert.True(t, fs.Changed("l"))
	assert.False(t, fs.Changed("n"))
}
