package core

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/pd-sidecar/pd-sidecar/proxy/encoder"
	"github.com/pd-sidecar/pd-sidecar/proxy/guard"
	"github.com/pd-sidecar/pd-sidecar/proxy/hedge"
	"github.com/pd-sidecar/pd-sidecar/proxy/moriwrite"
	"github.com/pd-sidecar/pd-sidecar/proxy/passpolicy"
	"github.com/pd-sidecar/pd-sidecar/proxy/prefillstrip"
	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

// What to do when the decode engine fails to load the remote KV.
const (
	// KVFailLocalPrefill re-runs the request on the local engine with a
	// local prefill (when nothing has reached the client yet).
	KVFailLocalPrefill = "local-prefill"
	// KVFailError passes the engine's error on to the client.
	KVFailError = "error"
)

// Config is the proxy's configuration. Start from DefaultConfig.
type Config struct {
	// Host is the address the proxy listens on ("" = all interfaces).
	Host string
	// Port is the proxy's port for data-parallel rank 0; rank r listens on
	// Port+r.
	Port int
	// ModelServerHost is the local engine's host.
	ModelServerHost string
	// ModelServerPort is the local engine's port for rank 0; rank r's engine
	// is on ModelServerPort+r.
	ModelServerPort int
	// DataParallelSize is the number of data-parallel ranks (>= 1).
	DataParallelSize int
	// PodIP is this pod's IP (POD_IP), the host by which a request's
	// x-data-parallel-host-port names one of its ranks (PodIP:Port+r). When
	// empty the ranks are named by Host, or by a loopback address when Host
	// is empty or unspecified (dprank.Pod).
	PodIP string
	// P2P is llm-d's P2P KV tier (proxy/kvsource).
	P2P P2PConfig
	// Multiturn is multi-turn KV reuse (proxy/multiturn); off by default.
	Multiturn MultiturnConfig
	// PrefillerSampling picks a random entry of a comma-separated
	// x-prefiller-host-port instead of the first.
	PrefillerSampling bool
	// PrefillMaxRetries is how many times a retryable prefill failure
	// (unreachable, 5xx, 429) is retried before falling back.
	PrefillMaxRetries int
	// PrefillRetryBackoff is the wait before each retry.
	PrefillRetryBackoff time.Duration
	// PrefillTimeout bounds the whole prefill phase, retries included.
	PrefillTimeout time.Duration
	// DecodeFirstByteTimeout bounds, for a streamed answer, the wait for the
	// local engine's first event (first output for a decode on remote KV),
	// the head not counting: vLLM sends it at once (504 past it); 0 waits as
	// long as the client does. Once the stream has begun no total timeout
	// applies.
	DecodeFirstByteTimeout time.Duration
	// ConnectTimeout bounds each TCP connect to an engine.
	ConnectTimeout time.Duration
	// EngineInfoInterval is how often the local engine's version is asked
	// (engineinfo; every second until it first answers); 0: never.
	EngineInfoInterval time.Duration
	// PrefillFallback degrades a failed prefill to a local prefill; when
	// false the failure is answered with an error.
	PrefillFallback bool
	// OnKVLoadFailure is KVFailLocalPrefill or KVFailError.
	OnKVLoadFailure string
	// ReleaseKVOnCancel frees the prefiller's KV of a split whose decode
	// leg never read it (the client left first): a one-token decode leg
	// with the handoff is sent to the local engine in the background
	// (proxy/kvrelease). Only for connectors whose decoder pulls (nixlv2).
	ReleaseKVOnCancel bool
	// DecodeTPSize is the local engine's tensor-parallel size; a prefill
	// answer with a larger tp_size degrades to local prefill. 0 disables
	// the check.
	DecodeTPSize int
	// MinRemotePrefillTokens is the short-prompt guard (shortPrompt): a
	// request that names a prefiller but whose prompt is estimated under
	// this many tokens (connectors.EstimatePromptTokens) is served locally,
	// with no prefill leg. 0 disables the guard.
	MinRemotePrefillTokens int
	// MaxRequestBodyBytes bounds client request bodies (413 above).
	MaxRequestBodyBytes int
	// MaxUpstreamAnswerBytes bounds every upstream answer the sidecar reads
	// whole (a prefill answer, a bootstrap /query, a non-streamed decode
	// answer): past it a prefill fails (bad_answer) and a decode is a 502.
	MaxUpstreamAnswerBytes int64
	// MaxSSEEventBytes bounds one SSE event of an upstream stream, on every
	// stream reader of both serving paths (sse.Bound): past it the
	// stream is refused, a 502 before any output, else an error event.
	MaxSSEEventBytes int
	// ShutdownGrace bounds the drain of in-flight requests on shutdown.
	ShutdownGrace time.Duration
	// MetricsPort serves /metrics and /debug/pd on their own port; 0 serves
	// them on the proxy's port(s).
	MetricsPort int
	// MaxConnsPerHost bounds the pooled connections to each engine.
	MaxConnsPerHost int
	// MaxPrefillers bounds distinct prefiller metric labels and pools.
	MaxPrefillers int
	// StreamLoops is the number of event loops that serve local inference
	// requests from first byte to last and hold idle connections (the lane),
	// and carry the other open streams once their answer has begun
	// (loopStream): an idle connection or an open stream then holds no
	// goroutine and no buffer. 0 keeps fasthttp's goroutine per connection
	// for everything.
	StreamLoops int
	// DecodeChunkSize > 0 runs the decode of a /v1/chat/completions request
	// (decoder-only, or the decode leg of a nixlv2 split) as a series of
	// requests of at most this many tokens, stitched into one answer
	// (proxy/chunked); 0: off.
	DecodeChunkSize int
	// PrefillPrewarm sends each newly seen prefiller a warm-up split in
	// the background, so that the local engine's KV connection to it is made
	// before a client request needs it (proxy/prewarm).
	PrefillPrewarm bool
	// PrefillPrewarmSpread is the window over which a warm-up of a
	// prefiller the InferencePool watch (or the static allowlist at start)
	// reports is delayed by a random share (prewarm.Deps.Spread).
	PrefillPrewarmSpread time.Duration
	// Guard holds the limits, SSRF protection, circuit breaker and TLS
	// (proxy/guard, proxy/tlsconf).
	Guard guard.Config
	// Encoder is llm-d's encoder stage (proxy/encoder); off by default.
	Encoder encoder.Config
	// MoriIO is MoRI-IO write mode on nixlv2 (proxy/moriwrite).
	MoriIO moriwrite.Config
	// Hedge is hedged prefill (proxy/hedge); off by default.
	Hedge hedge.Config
	// Passthrough says which other requests pass through to the local
	// engine (proxy/passpolicy).
	Passthrough passpolicy.Config
	// PrefillStripHeaders are client headers removed from every leg sent
	// to a prefiller (proxy/prefillstrip); never from the local engine's.
	PrefillStripHeaders []string
}

// DefaultConfig returns the defaults, drop-in compatible with llm-d's
// pd-sidecar where the flags overlap.
func DefaultConfig() Config {
	return Config{
		Port:                   8000,
		ModelServerHost:        "127.0.0.1",
		ModelServerPort:        8200,
		DataParallelSize:       1,
		P2P:                    P2PConfig{Port: DefaultP2PPort},
		Multiturn:              DefaultMultiturnConfig(),
		PrefillRetryBackoff:    200 * time.Millisecond,
		PrefillTimeout:         30 * time.Second,
		DecodeFirstByteTimeout: 60 * time.Second,
		ConnectTimeout:         2 * time.Second,
		EngineInfoInterval:     time.Minute,
		PrefillFallback:        true,
		OnKVLoadFailure:        KVFailLocalPrefill,
		ReleaseKVOnCancel:      true,
		PrefillPrewarmSpread:   10 * time.Second,
		MaxRequestBodyBytes:    32 << 20,
		MaxUpstreamAnswerBytes: upstream.DefaultMaxUpstreamAnswerBytes,
		MaxSSEEventBytes:       sse.DefaultMaxEventBytes,
		ShutdownGrace:          30 * time.Second,
		MaxConnsPerHost:        1024,
		MaxPrefillers:          64,
		StreamLoops:            runtime.GOMAXPROCS(0),
		Guard:                  guard.DefaultConfig(),
		Encoder:                encoder.DefaultConfig(),
		Hedge:                  hedge.Config{Budget: 0.1},
		Passthrough:            passpolicy.DefaultConfig(),
	}
}

func validPort(p int) bool { return p > 0 && p < 65536 }

// Validate reports the first invalid setting, as one line.
func (c Config) Validate() error {
	switch {
	case c.DataParallelSize < 1:
		return fmt.Errorf("--data-parallel-size must be >= 1, got %d", c.DataParallelSize)
	case !validPort(c.Port) || !validPort(c.Port+c.DataParallelSize-1):
		return fmt.Errorf("--port %d (with %d data-parallel ranks) is not a valid port range", c.Port, c.DataParallelSize)
	case !validPort(c.ModelServerPort) || !validPort(c.ModelServerPort+c.DataParallelSize-1):
		return fmt.Errorf("--model-server-port %d (with %d data-parallel ranks) is not a valid port range", c.ModelServerPort, c.DataParallelSize)
	case c.ModelServerHost == "":
		return errors.New("the model server host must not be empty")
	case c.MetricsPort < 0 || c.MetricsPort > 65535:
		return fmt.Errorf("--metrics-port %d is not a port (0 = serve /metrics and /debug/pd on --port)", c.MetricsPort)
	case c.MetricsPort != 0 && c.MetricsPort >= c.Port && c.MetricsPort < c.Port+c.DataParallelSize:
		return fmt.Errorf("--metrics-port %d collides with a proxy port", c.MetricsPort)
	case c.P2P.Enabled && (!validPort(c.P2P.Port) || !validPort(c.P2P.Port+c.DataParallelSize-1)):
		return fmt.Errorf("--p2p-connector-port %d (with %d data-parallel ranks) is not a valid port range", c.P2P.Port, c.DataParallelSize)
	case c.Multiturn.Enabled && c.Multiturn.Validate() != nil:
		return c.Multiturn.Validate()
	case c.PrefillPrewarmSpread < 0:
		return fmt.Errorf("--prefill-prewarm-spread must be >= 0, got %v", c.PrefillPrewarmSpread)
	case c.PrefillMaxRetries < 0:
		return fmt.Errorf("--prefill-max-retries must be >= 0, got %d", c.PrefillMaxRetries)
	case c.PrefillRetryBackoff < 0:
		return fmt.Errorf("--prefill-retry-backoff must be >= 0, got %v", c.PrefillRetryBackoff)
	case c.PrefillTimeout <= 0:
		return fmt.Errorf("--prefill-timeout must be > 0, got %v", c.PrefillTimeout)
	case c.DecodeFirstByteTimeout < 0:
		return fmt.Errorf("--decode-first-byte-timeout must be >= 0, got %v", c.DecodeFirstByteTimeout)
	case c.ConnectTimeout <= 0:
		return fmt.Errorf("--connect-timeout must be > 0, got %v", c.ConnectTimeout)
	case c.EngineInfoInterval < 0:
		return fmt.Errorf("--engine-info-interval must be >= 0, got %v", c.EngineInfoInterval)
	case c.OnKVLoadFailure != KVFailLocalPrefill && c.OnKVLoadFailure != KVFailError:
		return fmt.Errorf("--on-kv-load-failure must be %q or %q, got %q", KVFailLocalPrefill, KVFailError, c.OnKVLoadFailure)
	case c.DecodeTPSize < 0:
		return fmt.Errorf("--decode-tp-size must be >= 0, got %d", c.DecodeTPSize)
	case c.MinRemotePrefillTokens < 0:
		return fmt.Errorf("--min-remote-prefill-tokens must be >= 0, got %d", c.MinRemotePrefillTokens)
	case c.MaxRequestBodyBytes <= 0:
		return fmt.Errorf("--max-request-body-bytes must be > 0, got %d", c.MaxRequestBodyBytes)
	case c.MaxUpstreamAnswerBytes <= 0:
		return fmt.Errorf("--max-upstream-answer-bytes must be > 0, got %d", c.MaxUpstreamAnswerBytes)
	case c.MaxSSEEventBytes < MinMaxSSEEventBytes:
		return fmt.Errorf("--max-sse-event-bytes must be >= %d, got %d", MinMaxSSEEventBytes, c.MaxSSEEventBytes)
	case c.ShutdownGrace < 0:
		return fmt.Errorf("--shutdown-grace must be >= 0, got %v", c.ShutdownGrace)
	case c.MaxConnsPerHost <= 0:
		return fmt.Errorf("--max-idle-conns-per-host must be > 0, got %d", c.MaxConnsPerHost)
	case c.DecodeChunkSize < 0:
		return fmt.Errorf("--decode-chunk-size %d must be >= 0", c.DecodeChunkSize)
	case c.StreamLoops < 0:
		return fmt.Errorf("--stream-loops must be >= 0, got %d", c.StreamLoops)
	case c.MaxPrefillers <= 0:
		return fmt.Errorf("max prefillers must be > 0, got %d", c.MaxPrefillers)
	case c.Guard.MaxBufferedBytes > 0 && c.Guard.MaxBufferedBytes < int64(c.MaxRequestBodyBytes):
		return fmt.Errorf("--max-buffered-bytes %d must be >= --max-request-body-bytes %d (a body of the largest accepted size could never be read)",
			c.Guard.MaxBufferedBytes, c.MaxRequestBodyBytes)
	}
	if err := c.Encoder.Validate(); err != nil {
		return err
	}
	if err := c.Hedge.Validate(); err != nil {
		return err
	}
	if err := c.MoriIO.Validate(); err != nil {
		return err
	}
	if err := c.Passthrough.Validate(); err != nil {
		return err
	}
	if err := prefillstrip.Validate(c.PrefillStripHeaders); err != nil {
		return err
	}
	return c.Guard.Validate()
}

// MultiturnConfig is multi-turn KV reuse (vLLM's bidirectional KV
// transfer, proxy/multiturn): a decode answer's kv_transfer_params kept
// per conversation and put in its next turn's prefill leg. The flags and
// defaults are those llm-d's sidecar proposes.
type MultiturnConfig struct {
	// Enabled is --enable-bidirectional-kv-xfer (nixlv2 only).
	Enabled bool
	// CacheSize bounds the conversations kept (--bidirectional-cache-size).
	CacheSize int
	// CacheBytes bounds what they cost (--bidirectional-cache-bytes).
	CacheBytes int
	// CacheClientShare is the part of both bounds one client (one
	// address; an IPv6 /64) keeps whatever other clients do
	// (--bidirectional-cache-client-share, 0 < share ≤ 1): a client that
	// holds it makes room from its own oldest entries.
	CacheClientShare float64
	// CacheTTL is how long an entry is kept (--bidirectional-cache-ttl):
	// no longer than the decode engines' decoder_kv_blocks_ttl. An entry
	// is used at most until MultiturnMargin before it ends, since vLLM's
	// prefill engine declines a read of blocks that expire within 5 s.
	CacheTTL time.Duration
	// SessionHeader names the request header of the session key
	// (--bidirectional-session-header); a body's conversation_id is the
	// key when the header is absent.
	SessionHeader string
	// RecomputeThreshold is the fewest history tokens put in a prefill
	// leg (--bidirectional-recompute-threshold).
	RecomputeThreshold int
	// KeepReasoning keeps the history of answers with reasoning
	// (--bidirectional-keep-reasoning); off: many reasoning models' chat
	// templates drop past turns' reasoning, and their next prompt is then
	// no extension of what the engine holds.
	KeepReasoning bool
	// SideChannelPort is the local decode engine's NIXL side-channel port
	// (--decode-side-channel-port: its VLLM_NIXL_SIDE_CHANNEL_PORT, vLLM's
	// default 5600), data-parallel rank r's being SideChannelPort+r: the
	// only port a decode answer's history may name.
	SideChannelPort int
	// ReleaseUnread frees the pins no turn will read
	// (--bidirectional-release-unread): an answer not kept, an entry
	// evicted, replaced or under the threshold gets a one-token prefill
	// leg to its prefiller carrying the pin, which makes that engine tell
	// the decode engine to free it.
	ReleaseUnread bool
}

// MultiturnMargin is what is taken off --bidirectional-cache-ttl: vLLM's
// prefill engine declines to read blocks that expire within 5 s, and the
// decode engine's deadline began before the sidecar saw its answer. 10 s,
// or a quarter of a TTL shorter than 40 s.
func MultiturnMargin(ttl time.Duration) time.Duration { return min(10*time.Second, ttl/4) }

// DefaultMultiturnConfig returns the defaults (off).
func DefaultMultiturnConfig() MultiturnConfig {
	return MultiturnConfig{CacheSize: 4096, CacheBytes: 64 << 20, CacheClientShare: 0.25, CacheTTL: 480 * time.Second,
		SessionHeader: "x-session-token", RecomputeThreshold: 64, SideChannelPort: 5600, ReleaseUnread: true}
}

// Validate reports the first invalid multi-turn setting.
func (c MultiturnConfig) Validate() error {
	switch {
	case c.CacheSize <= 0:
		return fmt.Errorf("--bidirectional-cache-size must be > 0, got %d", c.CacheSize)
	case c.CacheBytes <= 0:
		return fmt.Errorf("--bidirectional-cache-bytes must be > 0, got %d", c.CacheBytes)
	case !(c.CacheClientShare > 0 && c.CacheClientShare <= 1):
		return fmt.Errorf("--bidirectional-cache-client-share must be > 0 and <= 1, got %v", c.CacheClientShare)
	case c.CacheTTL <= 0:
		return fmt.Errorf("--bidirectional-cache-ttl must be > 0, got %v", c.CacheTTL)
	case c.SessionHeader == "":
		return errors.New("--bidirectional-session-header must not be empty")
	case c.RecomputeThreshold < 0:
		return fmt.Errorf("--bidirectional-recompute-threshold must be >= 0, got %d", c.RecomputeThreshold)
	case c.SideChannelPort < 1 || c.SideChannelPort > 65535:
		return fmt.Errorf("--decode-side-channel-port must be a port (1-65535), got %d", c.SideChannelPort)
	}
	return nil
}
