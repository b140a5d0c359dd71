// Command engine-sim is a simulated vLLM/SGLang-compatible inference engine
// for testing pd-sidecar end to end without a GPU. See docs/engine-sim.md for
// every flag and the wire protocols it speaks.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/pd-sidecar/pd-sidecar/e2e/enginesim"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer/transports"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "engine-sim:", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	cfg := enginesim.DefaultConfig()
	fs := pflag.NewFlagSet("engine-sim", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringVar(&cfg.Host, "host", cfg.Host, "address to listen on (and to advertise as remote_host)")
	fs.IntVar(&cfg.Port, "port", cfg.Port, "HTTP port (OpenAI API, /metrics, /sim/*)")
	fs.StringVar(&cfg.Model, "model", cfg.Model, "served model name")
	role := fs.String("role", string(cfg.Role), "prefill, decode, both or encode (answers one-item encoder requests with ec_transfer_params)")
	fs.StringVar(&cfg.EngineID, "engine-id", "", "engine id advertised as remote_engine_id (random when empty)")
	fs.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "tokens per KV block")
	fs.IntVar(&cfg.NumKVBlocks, "num-kv-blocks", cfg.NumKVBlocks, "KV cache capacity in blocks")
	fs.BoolVar(&cfg.NoPrefixCaching, "no-enable-prefix-caching", cfg.NoPrefixCaching, "turn the prefix cache off: every prompt token is computed (or pulled)")
	prefillUS := fs.Float64("prefill-us-per-token", float64(cfg.PrefillPerToken/time.Microsecond), "prefill cost per uncached prompt token, microseconds")
	decodeUS := fs.Float64("decode-us-per-token", float64(cfg.DecodePerToken/time.Microsecond), "cost of each generated token after the first, microseconds")
	fs.Float64Var(&cfg.KVBandwidth, "kv-bandwidth", cfg.KVBandwidth, "bytes per second of a KV pull (0: unpaced)")
	fs.IntVar(&cfg.KVBytesPerToken, "kv-bytes-per-token", cfg.KVBytesPerToken, "KV bytes per token (a multiple of 8)")
	fs.DurationVar(&cfg.KVLease, "kv-lease", cfg.KVLease, "how long a prefill holds blocks for a remote decoder")
	fs.StringVar(&cfg.KVLoadFailurePolicy, "kv-load-failure-policy", cfg.KVLoadFailurePolicy, "fail or recompute: what a decode does when its KV pull fails")
	fs.DurationVar(&cfg.KVHandshakeDelay, "kv-handshake-delay", cfg.KVHandshakeDelay, "how long a decode's first NIXL pull from a prefiller engine (by remote_engine_id) waits for their handshake, once per prefiller engine (0: none)")
	fs.BoolVar(&cfg.KVVerifyChecksums, "kv-verify-checksums", cfg.KVVerifyChecksums, "verify pulled blocks against the prefiller's checksums (NIXL does not)")
	fs.IntVar(&cfg.MaxRunning, "max-running", cfg.MaxRunning, "requests served at once; more wait in the queue")
	fs.IntVar(&cfg.PrefillSlots, "prefill-slots", cfg.PrefillSlots, "prefills computing at once, as on a compute-bound engine; more wait (0: unbounded)")
	fs.IntVar(&cfg.DefaultMaxTokens, "default-max-tokens", cfg.DefaultMaxTokens, "token cap when a request sets none")
	fs.IntVar(&cfg.TPSize, "tp-size", cfg.TPSize, "tensor-parallel size reported as tp_size")
	fs.IntVar(&cfg.DCPSize, "dcp-size", cfg.DCPSize, "decode-context-parallel size reported as dcp_size (where the wire shape has it)")
	fs.IntVar(&cfg.PPSize, "pp-size", cfg.PPSize, "pipeline-parallel size reported as pp_size (where the wire shape has it)")
	fs.IntVar(&cfg.MooncakeDPRanks, "mooncake-dp-ranks", cfg.MooncakeDPRanks, "data-parallel ranks of a Mooncake prefill engine: GET /query names one engine id each (<id>_dp<rank>), and a prefill runs on the rank its X-data-parallel-rank names, else on the next in turn")
	fs.StringVar(&cfg.WireShape, "wire-shape", cfg.WireShape, "NIXL prefill answer shape of the upstream corpus this engine writes and reads: "+strings.Join(enginesim.WireShapes(), ", "))
	fs.IntVar(&cfg.KVPort, "kv-port", 0, "KV side channel port (NIXL stand-in); 0 picks a free one")
	fs.IntVar(&cfg.BootstrapPort, "bootstrap-port", 8998, "SGLang bootstrap port; 0 picks a free one")
	fs.IntVar(&cfg.P2PPort, "p2p-port", 0, "OffloadingConnector P2P listener port (every role: remote_prefiller and remote_kv_source pulls); 0 picks a free one")
	fs.IntVar(&cfg.MoriIONotifyPort, "moriio-notify-port", 0, "MoRI-IO write mode's notify port (decode and both roles): prefill engines write KV there under a transfer_id; 0: none")
	fs.DurationVar(&cfg.BootstrapTimeout, "bootstrap-timeout", cfg.BootstrapTimeout, "how long a decode waits for its KV (SGLang room or pull)")
	kvTransport := fs.String("kv-agent-transport", "", "serve a host KV region with a kvtransfer agent over tcp, ucx or nixl (the sidecar connector); empty: off")
	fs.IntVar(&cfg.KVAgentPort, "kv-agent-port", 0, "kvtransfer agent port; 0 picks a free one")
	fs.StringVar(&cfg.KVRegionDir, "kv-region-dir", "", "directory of the KV region's shared-memory file (default /dev/shm)")
	fs.StringVar(&cfg.SharedStorageDir, "shared-storage-dir", "", "shared KV store directory (LMCache-style): computed blocks are written there, prefills load from it")
	fs.StringVar(&cfg.ECSharedDir, "ec-shared-dir", "", "shared encoder cache directory (ec-example): an encoder writes each item's encoding there, other engines read it")
	fs.BoolVar(&cfg.BidirectionalKVXfer, "bidirectional-kv-xfer", cfg.BidirectionalKVXfer, "NixlConnector bidirectional_kv_xfer: a finished decode leg pins its sequence's KV for the next turn's prefill, which pulls it back over the KV side channel (every role then listens on --kv-port)")
	fs.DurationVar(&cfg.DecoderKVBlocksTTL, "decoder-kv-blocks-ttl", cfg.DecoderKVBlocksTTL, "how long a decode engine keeps a pinned sequence for the next turn (decoder_kv_blocks_ttl)")
	fs.IntVar(&cfg.KVRecomputeThreshold, "kv-recompute-threshold", cfg.KVRecomputeThreshold, "history tokens below which a prefill recomputes them instead of pulling them from the decode engine (kv_recompute_threshold)")
	fs.IntVar(&cfg.ReasoningTokens, "reasoning-tokens", cfg.ReasoningTokens, "leading generated tokens of a chat completion rendered as reasoning_content (0: none)")
	fs.IntVar(&cfg.ResponsesStore, "responses-store", cfg.ResponsesStore, "/v1/responses answers kept for a later previous_response_id, the oldest forgotten first (0: none kept; every previous_response_id answered 404, as vLLM without VLLM_ENABLE_RESPONSES_API_STORE)")
	faults := fs.String("faults", "", `faults active from the start, as JSON (see POST /sim/faults), e.g. '{"status":500}'`)
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	cfg.Role = enginesim.Role(*role)
	cfg.PrefillPerToken = time.Duration(*prefillUS * float64(time.Microsecond))
	cfg.DecodePerToken = time.Duration(*decodeUS * float64(time.Microsecond))
	if *faults != "" {
		dec := json.NewDecoder(strings.NewReader(*faults))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg.Faults); err != nil {
			return fmt.Errorf("--faults: %w", err)
		}
	}
	if *kvTransport != "" {
		tr, err := transports.NewWith(*kvTransport, transports.Options{NIXLLibrary: os.Getenv("NIXL_CAPI_LIB")})
		if err != nil {
			return err
		}
		cfg.KVTransport = tr
	}
	level, err := zerolog.ParseLevel(*logLevel)
	if err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := zerolog.New(os.Stderr).Level(level).With().Timestamp().Str("component", "engine-sim").Logger()
	sim, err := enginesim.New(cfg, log)
	if err != nil {
		return err
	}
	ls, err := sim.Listen()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return sim.Serve(ctx, ls)
}
