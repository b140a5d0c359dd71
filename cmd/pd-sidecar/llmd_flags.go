package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/pflag"
)

// llmdOptions are llm-d's sidecar flags that pd-sidecar accepts so that
// llm-d's arg lists start it unchanged: the --zap-* logging flags, and the
// flags of chunked decode, the P2P KV tier, MoRI-IO and the encoder stage
// (--ec-connector; its own flags are in encoder.go).
type llmdOptions struct {
	zap zapOptions

	decodeChunkSize  int
	ecConnector      string
	enableP2PPull    bool
	p2pConnectorPort int

	moriio moriioOptions
}

// zapOptions are controller-runtime's --zap-* flags, mapped onto zerolog.
type zapOptions struct {
	level      zapLevel
	devel      bool
	encoder    zapChoice
	stackLevel zapChoice
	timeEnc    string
}

// moriioOptions are llm-d's --moriio-* flags (MoRI-IO write mode on nixlv2;
// moriio.go).
type moriioOptions struct {
	writeMode        bool
	parallelDispatch bool
	decodeNotify     int
	decodeHandshake  int
	prefillNotify    int
	prefillHandshake int
	localPodIP       string
	waitTimeout      time.Duration
	tpSize           int
	dpSize           int
	dpSizeLocal      int
	remoteHosts      []string
	decodeHosts      []string
}

// Defaults of llm-d's flags.
const (
	defaultP2PConnectorPort = 7777
	defaultMoriioNotifyPort = 61005
	defaultMoriioHandshake  = 6301
)

// envPort is the port in the environment variable name, else def; a value
// that is not an integer is ignored, as llm-d ignores it (the range is
// checked with the flag's).
func envPort(getenv func(string) string, name string, def int) int {
	if n, err := strconv.Atoi(getenv(name)); err == nil {
		return n
	}
	return def
}

// envBool is the boolean in the environment variable name, else def; a
// value strconv.ParseBool does not read is ignored, as llm-d ignores it.
func envBool(getenv func(string) string, name string, def bool) bool {
	if b, err := strconv.ParseBool(getenv(name)); err == nil {
		return b
	}
	return def
}

// addLLMDFlags declares llm-d's logging flags and the flags of its
// features not built yet on fs; getenv reads the environment
// (P2P_CONNECTOR_PORT, POD_IP), whose values are the flags' defaults.
func addLLMDFlags(fs *pflag.FlagSet, o *llmdOptions, getenv func(string) string) {
	z := &o.zap
	z.encoder = zapChoice{flag: "zap-encoder", choices: []string{"json", "console"}}
	z.stackLevel = zapChoice{flag: "zap-stacktrace-level", choices: []string{"info", "error", "panic"}}
	fs.Var(&z.level, "zap-log-level", "llm-d's log level: debug, info, error, panic, or an integer verbosity (1-3: info, 4: debug, 5 and above: trace); --log-level, when given, wins")
	fs.BoolVar(&z.devel, "zap-devel", false, "llm-d's development logging: debug level unless --zap-log-level or --log-level is given (lines stay JSON)")
	fs.Var(&z.encoder, "zap-encoder", "llm-d's log encoder: json or console; accepted, lines are always zerolog JSON (llm-d forces JSON too)")
	fs.Var(&z.stackLevel, "zap-stacktrace-level", "llm-d's stack-trace level: info, error or panic; accepted, pd-sidecar's lines carry no stack traces")
	fs.StringVar(&z.timeEnc, "zap-time-encoding", "", "llm-d's time encoding (epoch, millis, nano, iso8601, rfc3339, rfc3339nano); accepted, the time field is always RFC 3339 (llm-d forces epoch)")

	fs.IntVar(&o.decodeChunkSize, "decode-chunk-size", 0, "chunked decode: N > 0 runs the decode of /v1/chat/completions requests (decoder-only, nixlv2 decode legs) as requests of at most N tokens, each continuing the one assistant message, stitched into one answer (0: off)")
	fs.StringVar(&o.ecConnector, "ec-connector", "", "llm-d's encoder stage for multimodal requests: ec-example (encoders write a shared encoder cache) or ec-nixl (their ec_transfer_params are passed on); the items of a request naming x-encoder-hosts-ports go to those encoders first (empty: off, the header is only stripped)")
	fs.BoolVar(&o.enableP2PPull, "enable-p2p-pull", false, "nixlv2 only: honour x-kv-cache-source-host-port, telling the prefill engine to pull the prompt's cached prefix from that engine's P2P KV tier first (remote_kv_source)")
	fs.IntVar(&o.p2pConnectorPort, "p2p-connector-port", envPort(getenv, "P2P_CONNECTOR_PORT", defaultP2PConnectorPort), "port of the engines' P2P KV tier (offloading, --enable-p2p-pull), rank r on port+r (env P2P_CONNECTOR_PORT)")

	m := &o.moriio
	fs.BoolVar(&m.writeMode, "moriio-write-mode", false, "nixlv2 only: MoRI-IO write mode (the prefill engine writes the KV into this decode engine): prefill leg, then decode leg, with MoRI-IO's kv_transfer_params")
	fs.BoolVar(&m.parallelDispatch, "moriio-parallel-dispatch", false, "MoRI-IO write mode with both legs sent at once, the decode's output held until the prefill answered (needs --moriio-write-mode)")
	fs.IntVar(&m.decodeNotify, "moriio-decode-notify-port", defaultMoriioNotifyPort, "MoRI-IO notify port of the decode engine (the prefill engine writes the KV there)")
	fs.IntVar(&m.decodeHandshake, "moriio-decode-handshake-port", defaultMoriioHandshake, "MoRI-IO handshake port of the decode engine")
	fs.IntVar(&m.prefillNotify, "moriio-prefill-notify-port", defaultMoriioNotifyPort, "MoRI-IO notify port of the prefill engines (parallel dispatch's decode leg)")
	fs.IntVar(&m.prefillHandshake, "moriio-prefill-handshake-port", defaultMoriioHandshake, "MoRI-IO handshake port of the prefill engines (parallel dispatch's decode leg)")
	fs.StringVar(&m.localPodIP, "moriio-local-pod-ip", getenv("POD_IP"), "MoRI-IO: this decode pod's IP or host name, the prefill leg's remote_host (env POD_IP; needed by --moriio-write-mode)")
	fs.DurationVar(&m.waitTimeout, "moriio-parallel-decode-wait-timeout", 30*time.Second, "MoRI-IO parallel dispatch: bound on the wait for the prefill leg's answer before the decode produced output; past it the request degrades to a local prefill (fallback reason kv_wait_timeout)")
	fs.IntVar(&m.tpSize, "moriio-tp-size", 1, "MoRI-IO tensor-parallel size (tp_size)")
	fs.IntVar(&m.dpSize, "moriio-dp-size", 1, "MoRI-IO data-parallel size: above 1 both legs are pinned to rank blake2s(request id) mod size (x-data-parallel-rank, remote_dp_rank)")
	fs.IntVar(&m.dpSizeLocal, "moriio-dp-size-local", 0, "MoRI-IO data-parallel ranks per host (wide-EP host lists; remote_dp_size_local)")
	fs.StringSliceVar(&m.remoteHosts, "moriio-remote-hosts", nil, "MoRI-IO wide-EP prefill hosts (comma-separated; names re-resolved on the request path, MORIIO_DNS_RESOLVE_TTL_SECONDS)")
	fs.StringSliceVar(&m.decodeHosts, "moriio-decode-hosts", nil, "MoRI-IO wide-EP decode hosts (comma-separated; names re-resolved on the request path, MORIIO_DNS_RESOLVE_TTL_SECONDS)")
}

// validate checks llm-d's flags as llm-d does, and refuses, in one line,
// a value that would turn on a feature not built yet. dp is
// --data-parallel-size, kvConnector --kv-connector.
func (o llmdOptions) validate(dp int, kvConnector string) error {
	if o.decodeChunkSize < 0 {
		return fmt.Errorf("--decode-chunk-size %d must be >= 0", o.decodeChunkSize)
	}
	switch o.ecConnector {
	case "":
	case "ec-example", "ec-nixl":
	default:
		return fmt.Errorf("--ec-connector %q is not one of ec-example, ec-nixl", o.ecConnector)
	}
	if err := checkPort("--p2p-connector-port", o.p2pConnectorPort); err != nil {
		return err
	}
	if dp > 1 && o.p2pConnectorPort+dp-1 > 65535 {
		return fmt.Errorf("--p2p-connector-port %d plus data-parallel rank %d exceeds 65535", o.p2pConnectorPort, dp-1)
	}
	switch {
	case o.enableP2PPull && kvConnector != "nixlv2":
		return fmt.Errorf("--enable-p2p-pull requires --kv-connector=nixlv2, got %q", kvConnector)
	}
	return o.moriio.validate()
}

// validate checks the --moriio-* flags as llm-d does (minus the start-up
// DNS resolution of the hosts: see moriioConfig).
func (m moriioOptions) validate() error {
	for _, p := range []struct {
		flag string
		port int
	}{
		{"--moriio-decode-notify-port", m.decodeNotify}, {"--moriio-decode-handshake-port", m.decodeHandshake},
		{"--moriio-prefill-notify-port", m.prefillNotify}, {"--moriio-prefill-handshake-port", m.prefillHandshake},
	} {
		if err := checkPort(p.flag, p.port); err != nil {
			return err
		}
	}
	switch {
	case m.tpSize < 1:
		return fmt.Errorf("--moriio-tp-size %d must be >= 1", m.tpSize)
	case m.dpSize < 1:
		return fmt.Errorf("--moriio-dp-size %d must be >= 1", m.dpSize)
	case m.dpSizeLocal < 0:
		return fmt.Errorf("--moriio-dp-size-local %d must be >= 0", m.dpSizeLocal)
	case m.waitTimeout <= 0:
		return fmt.Errorf("--moriio-parallel-decode-wait-timeout %v must be > 0", m.waitTimeout)
	}
	for _, h := range []struct {
		flag  string
		hosts []string
	}{{"--moriio-remote-hosts", m.remoteHosts}, {"--moriio-decode-hosts", m.decodeHosts}} {
		if len(h.hosts) <= 1 {
			continue
		}
		switch {
		case m.dpSizeLocal <= 0:
			return fmt.Errorf("%s with %d hosts needs --moriio-dp-size-local > 0", h.flag, len(h.hosts))
		case m.dpSize%m.dpSizeLocal != 0:
			return fmt.Errorf("--moriio-dp-size %d is not a multiple of --moriio-dp-size-local %d", m.dpSize, m.dpSizeLocal)
		case m.dpSize/m.dpSizeLocal != len(h.hosts):
			return fmt.Errorf("%s names %d hosts, but --moriio-dp-size / --moriio-dp-size-local is %d", h.flag, len(h.hosts), m.dpSize/m.dpSizeLocal)
		}
	}
	switch {
	case m.parallelDispatch && !m.writeMode:
		return fmt.Errorf("--moriio-parallel-dispatch needs --moriio-write-mode")
	case m.writeMode && m.localPodIP == "":
		return fmt.Errorf("--moriio-write-mode needs --moriio-local-pod-ip or POD_IP")
	}
	return nil
}

func checkPort(flag string, port int) error {
	if port <= 0 || port > 65535 {
		return fmt.Errorf("%s %d is not a port (1-65535)", flag, port)
	}
	return nil
}

// logLevel resolves the log level from --log-level and the --zap-* flags,
// whatever their order on the command line: --log-level when given
// (logLevelSet), else --zap-log-level when given, else debug with
// --zap-devel, else logLevel's default.
func (z zapOptions) logLevel(logLevel string, logLevelSet bool) (zerolog.Level, error) {
	lv, err := zerolog.ParseLevel(logLevel)
	if err != nil || logLevel == "" {
		return lv, fmt.Errorf("--log-level %q is not one of trace, debug, info, warn, error", logLevel)
	}
	switch {
	case logLevelSet:
		return lv, nil
	case z.level.set:
		return z.level.level, nil
	case z.devel:
		return zerolog.DebugLevel, nil
	}
	return lv, nil
}

// zapLevel is --zap-log-level: one of controller-runtime's level names or
// a positive integer verbosity N (zap level -N). llm-d prints V(1..3) as
// info, V(4) as debug and V(5) and above as trace, and so they map.
type zapLevel struct {
	raw   string
	level zerolog.Level
	set   bool
}

func (l *zapLevel) String() string { return l.raw }
func (l *zapLevel) Type() string   { return "level" }

func (l *zapLevel) Set(v string) error {
	names := map[string]zerolog.Level{
		"debug": zerolog.DebugLevel, "info": zerolog.InfoLevel,
		"error": zerolog.ErrorLevel, "panic": zerolog.PanicLevel,
	}
	lv, ok := names[strings.ToLower(v)]
	if !ok {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("%q is not debug, info, error, panic or an integer > 0", v)
		}
		switch {
		case n >= 5:
			lv = zerolog.TraceLevel
		case n == 4:
			lv = zerolog.DebugLevel
		default:
			lv = zerolog.InfoLevel
		}
	}
	l.raw, l.level, l.set = v, lv, true
	return nil
}

// zapChoice is a --zap-* flag that takes one of a few words.
type zapChoice struct {
	flag    string
	choices []string
	value   string
}

func (c *zapChoice) String() string { return c.value }
func (c *zapChoice) Type() string   { return "string" }

func (c *zapChoice) Set(v string) error {
	for _, w := range c.choices {
		if strings.EqualFold(v, w) {
			c.value = w
			return nil
		}
	}
	return fmt.Errorf("%q is not one of %s", v, strings.Join(c.choices, ", "))
}
