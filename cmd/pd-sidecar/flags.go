package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/pd-sidecar/pd-sidecar/connectors/offloading"
	"github.com/pd-sidecar/pd-sidecar/proxy"
	"github.com/pd-sidecar/pd-sidecar/proxy/core"
)

// errHelp: --help was asked for and printed.
var errHelp = errors.New("help requested")

type options struct {
	cfg       proxy.Config
	connector string
	// connectorOpts configure the connectors (registered in main.go).
	connectorOpts connectorOptions
	logLevel      zerolog.Level
	tracing       bool         // OpenTelemetry spans; OTEL_* can turn them on or off too (tracing.go)
	kv            kvOptions    // the sidecar connector's own KV pull (kv.go)
	guard         guardOptions // SSRF, TLS, limits, circuit breaker (security.go)
	llmd          llmdOptions  // llm-d's --zap-* flags and flags of features not built yet (llmd_flags.go)
}

// connectorAlias is llm-d's removed --connector: it sets --kv-connector,
// with the old name nixl read as nixlv2 (llm-d-modelservice renders
// --connector=nixlv2, or nixl).
type connectorAlias struct{ dst *string }

func (a connectorAlias) String() string {
	if a.dst == nil {
		return ""
	}
	return *a.dst
}

func (a connectorAlias) Type() string { return "string" }

func (a connectorAlias) Set(v string) error {
	if v == "nixl" {
		v = "nixlv2"
	}
	*a.dst = v
	return nil
}

// parseFlags reads the command line into options and validates them; the
// error is one line fit for stderr. --help prints the usage on help.
func parseFlags(args []string, help io.Writer) (options, error) {
	o := options{cfg: proxy.DefaultConfig()}
	c := &o.cfg
	fs := pflag.NewFlagSet("pd-sidecar", pflag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported as one line by the caller
	fs.StringVar(&c.Host, "host", c.Host, "address to listen on (empty: all interfaces)")
	fs.IntVar(&c.Port, "port", c.Port, "port to listen on (data-parallel rank r listens on port+r)")
	fs.IntVar(&c.ModelServerPort, "model-server-port", c.ModelServerPort, "local engine port (rank r: model-server-port+r)")
	vllmPort := fs.Int("vllm-port", c.ModelServerPort, "deprecated alias of --model-server-port, which wins when both are given")
	_ = fs.MarkDeprecated("vllm-port", "use --model-server-port")
	fs.StringVar(&c.ModelServerHost, "model-server-host", c.ModelServerHost, "local engine host")
	fs.StringVar(&o.connector, "kv-connector", "nixlv2", "KV connector protocol: "+connectorNames)
	// llm-d-modelservice renders its routing proxy with --connector and
	// klog's -v: accepted, hidden, so the image is a drop-in there.
	fs.Var(connectorAlias{&o.connector}, "connector", "removed in llm-d 0.10: alias of --kv-connector (nixl: nixlv2)")
	_ = fs.MarkDeprecated("connector", "use --kv-connector")
	fs.IntP("v", "v", 0, "klog verbosity of llm-d's routing sidecar: accepted and ignored (use --log-level)")
	_ = fs.MarkHidden("v")
	if err := addConnectorFlags(fs, &o.connectorOpts, os.Getenv); err != nil {
		return o, err
	}
	addKVFlags(fs, &o.kv)
	fs.IntVar(&c.DataParallelSize, "data-parallel-size", c.DataParallelSize, "number of data-parallel ranks")
	c.PodIP = os.Getenv("POD_IP") // the host x-data-parallel-host-port names this pod's ranks by (llm-d's)
	fs.BoolVar(&c.PrefillerSampling, "enable-prefiller-sampling", envBool(os.Getenv, "ENABLE_PREFILLER_SAMPLING", c.PrefillerSampling), "pick a random prefiller among comma-separated header values, else the first (env ENABLE_PREFILLER_SAMPLING)")
	fs.IntVar(&c.PrefillMaxRetries, "prefill-max-retries", c.PrefillMaxRetries, "retries of a prefill that failed retryably (unreachable, 5xx, 429)")
	fs.DurationVar(&c.PrefillRetryBackoff, "prefill-retry-backoff", c.PrefillRetryBackoff, "wait before each prefill retry")
	fs.DurationVar(&c.PrefillTimeout, "prefill-timeout", c.PrefillTimeout, "bound on the whole prefill leg, retries included")
	addHedgeFlags(fs, &c.Hedge)
	addMultiturnFlags(fs, &c.Multiturn)
	fs.DurationVar(&c.DecodeFirstByteTimeout, "decode-first-byte-timeout", c.DecodeFirstByteTimeout, "bound on the wait for a streamed answer's first event from the local engine (its first output for a decode on remote KV; the head, which vLLM sends at once, does not count): 504 past it; 0: none. The stream itself has no total timeout")
	fs.DurationVar(&c.ConnectTimeout, "connect-timeout", c.ConnectTimeout, "TCP connect timeout to engines")
	fs.DurationVar(&c.EngineInfoInterval, "engine-info-interval", c.EngineInfoInterval, "how often the local engine's version is read (vLLM GET /version, SGLang GET /get_server_info; every second until it first answers) into pd_sidecar_engine_info and the status view (0: never)")
	fs.BoolVar(&c.PrefillPrewarm, "prefill-prewarm", c.PrefillPrewarm, "send each newly seen prefiller (named by a request and allowed, or a new Ready pod of the --inference-pool) one tiny warm-up split in the background, so that the local engine's KV connection to it (NIXL's handshake) is made before a client request needs it; nixlv2 only; model from the local engine's GET /v1/models")
	fs.DurationVar(&c.PrefillPrewarmSpread, "prefill-prewarm-spread", c.PrefillPrewarmSpread, "with --prefill-prewarm: a prefiller the InferencePool watch reports as newly Ready (or a static allowlist entry at start) is warmed after a random share of this window, so that the fleet's sidecars, which all see it at once, warm it at (decode pods / window) a second instead of within the same ~100 ms; a prefiller a request names first is warmed at once (0: no wait)")
	fs.BoolVar(&c.PrefillFallback, "prefill-fallback", c.PrefillFallback, "degrade a failed prefill to a local prefill (false: answer the error)")
	fs.StringVar(&c.OnKVLoadFailure, "on-kv-load-failure", c.OnKVLoadFailure, "when the decode engine fails to load remote KV: local-prefill or error")
	fs.BoolVar(&c.ReleaseKVOnCancel, "release-kv-on-cancel", c.ReleaseKVOnCancel, "nixlv2: when a request ends after its prefill answered but before the decode engine read the KV (the client left), send the local engine a one-token, non-streamed decode leg with the handoff in the background (its answer discarded), so that the prefiller frees the blocks at once instead of after its abort timeout (vLLM: 480s)")
	fs.IntVar(&c.DecodeTPSize, "decode-tp-size", c.DecodeTPSize, "local engine tensor-parallel size; a larger prefill tp_size degrades to local prefill (0: no check)")
	fs.IntVar(&c.MinRemotePrefillTokens, "min-remote-prefill-tokens", c.MinRemotePrefillTokens, "short-prompt guard: a request naming a prefiller whose prompt is estimated under N tokens is served locally, with no prefill leg or KV transfer (mode local, pd_sidecar_split_declined_total{reason=\"short_prompt\"}); token ids count exactly, text as ceil(bytes/3) (0: off)")
	fs.IntVar(&c.MaxRequestBodyBytes, "max-request-body-bytes", c.MaxRequestBodyBytes, "largest accepted request body")
	fs.Int64Var(&c.MaxUpstreamAnswerBytes, "max-upstream-answer-bytes", c.MaxUpstreamAnswerBytes, "largest upstream answer read whole (prefill, bootstrap, non-streamed decode); a larger prefill answer falls back (bad_answer), a larger decode answer is a 502")
	fs.IntVar(&c.MaxSSEEventBytes, "max-sse-event-bytes", c.MaxSSEEventBytes, "longest SSE event of an engine's stream, on every stream reader of both serving paths; past it the stream is refused and its upstream connection closed: a 502 before any output, else an error event and [DONE] (pd_sidecar_upstream_refused_total{reason=\"event_too_long\"}); at least 16384")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", c.ShutdownGrace, "how long SIGTERM waits for in-flight requests")
	fs.IntVar(&c.MetricsPort, "metrics-port", c.MetricsPort, "port for /metrics and /debug/pd, which then leave --port (0: serve them on --port)")
	fs.IntVar(&c.MaxConnsPerHost, "max-idle-conns-per-host", c.MaxConnsPerHost, "connections pooled per engine")
	fs.IntVar(&c.StreamLoops, "stream-loops", c.StreamLoops, "event loops serving inference requests whole (local and sequential P/D) and carrying open streams (an idle connection or an open stream then holds no goroutine or buffer; 0: a goroutine per connection for everything)")
	level := fs.String("log-level", "info", "log level: trace, debug, info, warn, error; wins over --zap-log-level and --zap-devel")
	addLLMDFlags(fs, &o.llmd, os.Getenv)
	addEncoderFlags(fs, &c.Encoder)
	addGuardFlags(fs, &o)
	addExposureFlags(fs, c) // exposure.go
	fs.BoolVar(&o.tracing, "tracing", false, "export OpenTelemetry spans (OTLP over gRPC or HTTP, or console); OTEL_TRACES_EXPORTER=otlp or console turns tracing on without this flag, OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true keeps it off with it; endpoint, protocol, headers, sampler from the standard OTEL_* environment")
	if err := parseWithConfiguration(fs, args, os.ReadFile); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintf(help, "%s%s", usageHead, fs.FlagUsages())
			return o, errHelp
		}
		return o, err
	}
	if fs.Changed("vllm-port") && !fs.Changed("model-server-port") {
		c.ModelServerPort = *vllmPort
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	lv, err := o.llmd.zap.logLevel(*level, fs.Changed("log-level"))
	if err != nil {
		return o, err
	}
	o.logLevel = lv
	if err := o.llmd.validate(c.DataParallelSize, o.connector); err != nil {
		return o, err
	}
	c.DecodeChunkSize = o.llmd.decodeChunkSize
	c.Encoder.Connector = o.llmd.ecConnector
	if c.MoriIO, err = o.llmd.moriio.config(os.Getenv); err != nil { // moriio.go
		return o, err
	}
	if !fs.Changed("metrics-port") {
		if port, err := moriioMetricsPort(os.Getenv); err != nil {
			return o, err
		} else if port != 0 {
			c.MetricsPort = port // llm-d's MORIIO_METRICS_ADDR fallback (moriio.go)
		}
	}
	c.P2P = core.P2PConfig{
		Enabled: o.connector == offloading.Name || o.llmd.enableP2PPull,
		Port:    o.llmd.p2pConnectorPort,
	}
	if err := o.connectorOpts.validate(); err != nil {
		return o, err
	}
	if err := o.kv.validate(); err != nil {
		return o, err
	}
	if err := o.guard.apply(c); err != nil {
		return o, err
	}
	return o, c.Validate()
}
