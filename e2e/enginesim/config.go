package enginesim

import (
	"errors"
	"fmt"
	"time"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
)

// Role says which side of a P/D split the simulated engine plays.
type Role string

// The roles. RoleBoth serves local requests, prefills for remote decoders
// and decodes from remote KV.
const (
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
	RoleBoth    Role = "both"
)

// KV load failure policies, as vLLM's kv_transfer_config.kv_load_failure_policy.
const (
	PolicyFail      = "fail"
	PolicyRecompute = "recompute"
)

// Config configures one simulated engine. DefaultConfig gives the defaults.
type Config struct {
	// Host is the address to listen on and to advertise as remote_host.
	Host string
	// Port is the HTTP port; KVPort the KV side channel (NIXL stand-in);
	// BootstrapPort the SGLang bootstrap port; P2PPort the OffloadingConnector
	// P2P listener (every role). 0 picks a free port.
	Port, KVPort, BootstrapPort, P2PPort int
	// Model is the served model name.
	Model string
	// Role is prefill, decode or both.
	Role Role
	// EngineID is advertised as remote_engine_id (random when empty).
	EngineID string
	// BlockSize is the number of tokens per KV block.
	BlockSize int
	// NumKVBlocks is the KV cache capacity in blocks.
	NumKVBlocks int
	// NoPrefixCaching turns the prefix cache off (vLLM's
	// --no-enable-prefix-caching): every prompt token is computed, as on an
	// engine whose cache holds none of a prompt's prefix.
	NoPrefixCaching bool
	// PrefillPerToken is the prefill cost per uncached prompt token.
	PrefillPerToken time.Duration
	// DecodePerToken is the cost of each generated token after the first.
	DecodePerToken time.Duration
	// KVBandwidth paces KV pulls, in bytes per second (0: unpaced).
	KVBandwidth float64
	// KVBytesPerToken is the KV size of one token.
	KVBytesPerToken int
	// KVLease is how long a prefill holds blocks for a remote decoder.
	KVLease time.Duration
	// KVLoadFailurePolicy is PolicyFail or PolicyRecompute.
	KVLoadFailurePolicy string
	// KVHandshakeDelay is how long a decode engine's first NIXL pull from
	// a prefiller engine waits for their handshake (handshake.go); 0: none.
	KVHandshakeDelay time.Duration
	// KVVerifyChecksums makes the decoder check pulled blocks against the
	// prefiller's checksums (real NIXL does not; off by default).
	KVVerifyChecksums bool
	// BootstrapTimeout bounds how long an SGLang decode waits for its room.
	BootstrapTimeout time.Duration
	// MaxRunning is the number of requests served at once; more wait.
	MaxRunning int
	// PrefillSlots bounds the prefills computing at once (0: unbounded).
	// A real engine's prefill is compute-bound: its prefills share the
	// GPU, so one more prefill makes the others wait. With N slots, a
	// request whose prefill finds them all taken waits for one (counted in
	// vllm:num_requests_waiting); decode steps and KV pulls take none.
	PrefillSlots int
	// DefaultMaxTokens applies when a request sets no token cap.
	DefaultMaxTokens int
	// TPSize is reported as tp_size in kv_transfer_params.
	TPSize int
	// DCPSize and PPSize are reported as dcp_size and pp_size, where the
	// wire shape has them.
	DCPSize, PPSize int
	// MooncakeDPRanks is the data-parallel ranks a Mooncake prefill engine
	// runs (mooncake.go): GET /query answers one engine id each, and a
	// prefill runs on the rank its X-data-parallel-rank names, else on the
	// next in turn, as vLLM's API server balances them.
	MooncakeDPRanks int
	// WireShape names the NIXL prefill answer shape of the upstream corpus
	// this engine writes and reads (wireshape.go).
	WireShape string
	// Faults are active from the start.
	Faults Faults
	// SharedStorageDir, when set, is the shared KV store (LMCache-style):
	// computed blocks are written there and prefills load from it.
	SharedStorageDir string
	// KVTransport, when set, gives the engine a host KV region and a
	// kvtransfer agent serving it over this transport (the sidecar
	// connector); nil disables both.
	KVTransport kvtransfer.Transport
	// MoriIONotifyPort, when > 0, is MoRI-IO write mode's notify port on a
	// decode-capable engine: prefill engines write KV into it (moriio.go).
	MoriIONotifyPort int
	// KVAgentPort is the agent's port (0 picks a free one).
	KVAgentPort int
	// KVRegionDir holds the region's shared-memory file (default /dev/shm,
	// else the temp dir).
	KVRegionDir string
	// ECSharedDir, when set, is the shared encoder cache (ec-example): an
	// encoder writes each item's encoding there, other engines read it
	// (encoder.go).
	ECSharedDir string
	// BidirectionalKVXfer is NixlConnector's bidirectional_kv_xfer
	// (bidirectional.go): a decode leg that finishes pins its sequence's
	// blocks for the next turn's prefill, and a prefill leg whose
	// kv_transfer_params name such a pin pulls that history instead of
	// computing it. The engine listens on its KV side channel in every
	// role.
	BidirectionalKVXfer bool
	// DecoderKVBlocksTTL is how long a decode engine keeps a pinned
	// sequence (decoder_kv_blocks_ttl), a fixed deadline from the pin.
	DecoderKVBlocksTTL time.Duration
	// KVRecomputeThreshold (kv_recompute_threshold) is the number of
	// history tokens below which a prefill recomputes them rather than
	// pulling them.
	KVRecomputeThreshold int
	// ReasoningTokens is the number of leading generated tokens of a chat
	// completion rendered as reasoning (message.reasoning_content, or
	// delta.reasoning_content when streamed); 0: none.
	ReasoningTokens int
	// ResponsesStore is the number of /v1/responses answers kept for a
	// later request's previous_response_id, the oldest forgotten first
	// (responses.go); 0: none kept, every previous_response_id answered
	// 404, as vLLM without VLLM_ENABLE_RESPONSES_API_STORE.
	ResponsesStore int
}

// DefaultConfig returns the defaults the engine-sim binary uses.
func DefaultConfig() Config {
	return Config{
		Host:                 "127.0.0.1",
		Port:                 8200,
		Model:                "sim-model",
		Role:                 RoleBoth,
		BlockSize:            16,
		NumKVBlocks:          16384,
		PrefillPerToken:      50 * time.Microsecond,
		DecodePerToken:       2 * time.Millisecond,
		KVBandwidth:          1e9,
		KVBytesPerToken:      256,
		KVLease:              30 * time.Second,
		KVLoadFailurePolicy:  PolicyFail,
		BootstrapTimeout:     30 * time.Second,
		MaxRunning:           256,
		DefaultMaxTokens:     16,
		TPSize:               1,
		DCPSize:              1,
		MooncakeDPRanks:      1,
		PPSize:               1,
		WireShape:            DefaultWireShape,
		DecoderKVBlocksTTL:   480 * time.Second,
		KVRecomputeThreshold: 64,
		ResponsesStore:       1024,
	}
}

// ErrInvalidConfig is wrapped by every Validate error.
var ErrInvalidConfig = errors.New("invalid engine-sim configuration")

// Validate reports the first invalid setting.
func (c Config) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, a...))
	}
	switch {
	case c.Role != RolePrefill && c.Role != RoleDecode && c.Role != RoleBoth && c.Role != RoleEncode:
		return bad("--role must be prefill, decode, both or encode, not %q", c.Role)
	case c.Model == "":
		return bad("--model must not be empty")
	case c.BlockSize <= 0:
		return bad("--block-size must be positive")
	case c.NumKVBlocks <= 0:
		return bad("--num-kv-blocks must be positive")
	case c.KVBytesPerToken <= 0 || c.KVBytesPerToken%8 != 0:
		return bad("--kv-bytes-per-token must be a positive multiple of 8")
	case c.PrefillPerToken < 0 || c.DecodePerToken < 0:
		return bad("per-token costs must not be negative")
	case c.KVBandwidth < 0:
		return bad("--kv-bandwidth must not be negative")
	case c.KVLease < 0:
		return bad("--kv-lease must not be negative")
	case c.KVHandshakeDelay < 0:
		return bad("--kv-handshake-delay must not be negative")
	case c.KVLoadFailurePolicy != PolicyFail && c.KVLoadFailurePolicy != PolicyRecompute:
		return bad("--kv-load-failure-policy must be fail or recompute, not %q", c.KVLoadFailurePolicy)
	case c.MaxRunning <= 0:
		return bad("--max-running must be positive")
	case c.PrefillSlots < 0:
		return bad("--prefill-slots must not be negative")
	case c.DefaultMaxTokens <= 0:
		return bad("--default-max-tokens must be positive")
	case c.TPSize <= 0:
		return bad("--tp-size must be positive")
	case c.MooncakeDPRanks <= 0 || c.MooncakeDPRanks > 4096:
		return bad("--mooncake-dp-ranks must be within 1..4096")
	case c.DCPSize <= 0 || c.PPSize <= 0:
		return bad("--dcp-size and --pp-size must be positive")
	case c.KVAgentPort < 0 || c.KVAgentPort > 65535:
		return bad("--kv-agent-port must be within 0..65535")
	case c.Port < 0 || c.Port > 65535 || c.KVPort < 0 || c.KVPort > 65535 || c.BootstrapPort < 0 || c.BootstrapPort > 65535:
		return bad("ports must be within 0..65535")
	case c.MoriIONotifyPort < 0 || c.MoriIONotifyPort > 65535:
		return bad("--moriio-notify-port %d is not a port", c.MoriIONotifyPort)
	case c.P2PPort < 0 || c.P2PPort > 65535:
		return bad("--p2p-port must be within 0..65535")
	case c.DecoderKVBlocksTTL < 0:
		return bad("--decoder-kv-blocks-ttl must not be negative")
	case c.KVRecomputeThreshold < 0:
		return bad("--kv-recompute-threshold must not be negative")
	case c.ReasoningTokens < 0:
		return bad("--reasoning-tokens must not be negative")
	case c.ResponsesStore < 0:
		return bad("--responses-store must not be negative")
	}
	return c.Faults.Validate()
}

func (c Config) blockBytes() int { return c.BlockSize * c.KVBytesPerToken }

func (c Config) canPrefillRemote() bool { return c.Role != RoleDecode }
func (c Config) canDecodeRemote() bool  { return c.Role != RolePrefill }

// servesKV reports whether the engine listens on its KV side channel: a
// prefill-capable role serves its holds there, and with bidirectional KV
// transfer a decode engine serves its pinned sequences there too.
func (c Config) servesKV() bool { return c.canPrefillRemote() || c.BidirectionalKVXfer }
