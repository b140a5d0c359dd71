package main

import (
	"github.com/spf13/pflag"

	"github.com/pd-sidecar/pd-sidecar/proxy/core"
)

// addMultiturnFlags adds the flags of multi-turn KV reuse, with the names
// and defaults llm-d's sidecar proposes for the same feature.
func addMultiturnFlags(fs *pflag.FlagSet, c *core.MultiturnConfig) {
	fs.BoolVar(&c.Enabled, "enable-bidirectional-kv-xfer", c.Enabled, "multi-turn KV reuse (nixlv2; the engines run vLLM's NixlConnector with bidirectional_kv_xfer): keep each decode answer's kv_transfer_params under the digest of what the decode engine saw and produced, and put them in the prefill leg of the turn whose messages (or prompt) extend it exactly, found by its content; that engine pulls the history from this pod's engine instead of computing it. A session key (--bidirectional-session-header, else the body's conversation_id, which is removed) only narrows the search, as do the model and cache_salt")
	fs.IntVar(&c.CacheSize, "bidirectional-cache-size", c.CacheSize, "histories kept for the turns that extend them (when it is full, which go first: --bidirectional-cache-client-share)")
	fs.IntVar(&c.CacheBytes, "bidirectional-cache-bytes", c.CacheBytes, "bound on what the kept histories cost, in bytes")
	fs.Float64Var(&c.CacheClientShare, "bidirectional-cache-client-share", c.CacheClientShare, "part of --bidirectional-cache-size and --bidirectional-cache-bytes one client (one TCP peer address; an IPv6 /64) keeps whatever other clients do: while the cache is full, a client holding its share makes room from its own oldest histories, one under it from those of a client over its share first (0 < share <= 1; 1: no share)")
	fs.DurationVar(&c.CacheTTL, "bidirectional-cache-ttl", c.CacheTTL, "how long a history is kept: the decode engines' decoder_kv_blocks_ttl, which it must not pass (it is used until 10s, or a quarter of a TTL under 40s, before it ends); every finished answer's blocks stay pinned on the engine that long unless a next turn reads them")
	fs.StringVar(&c.SessionHeader, "bidirectional-session-header", c.SessionHeader, "request header of the session key, which narrows the search for a history (llm-d's picker sets x-session-token to the pod's name, the same for every conversation: histories are still found by content); removed from every leg while --enable-bidirectional-kv-xfer is on")
	fs.BoolVar(&c.KeepReasoning, "bidirectional-keep-reasoning", c.KeepReasoning, "keep the history of answers with reasoning too (only for models whose chat template renders past turns' reasoning back into the prompt as generated; many drop it, and the engine's KV is then no prefix of the next prompt); a next turn must carry the reasoning back verbatim")
	fs.IntVar(&c.SideChannelPort, "decode-side-channel-port", c.SideChannelPort, "the local decode engine's NIXL side-channel port (its VLLM_NIXL_SIDE_CHANNEL_PORT; data-parallel rank r's is this plus r, as vLLM adds the rank): the only port a decode answer's kv_transfer_params may name to be kept for the next turn")
	fs.BoolVar(&c.ReleaseUnread, "bidirectional-release-unread", c.ReleaseUnread, "free the decode engine's pins no turn will read (an answer not kept: tool calls, reasoning, choices; a history evicted, replaced or under the recompute threshold) with a one-token prefill leg to the split's prefiller carrying the pin, which pulls nothing and tells the decode engine to free it; off: they hold its blocks for decoder_kv_blocks_ttl")
	fs.IntVar(&c.RecomputeThreshold, "bidirectional-recompute-threshold", c.RecomputeThreshold, "fewest history tokens put in a prefill leg (vLLM's kv_recompute_threshold)")
}
