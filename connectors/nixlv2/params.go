package nixlv2

import (
	"math"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// Bounds of the kv_transfer_params a prefill answer may hand on.
const (
	// MaxBlockIDs bounds remote_block_ids (all KV-cache groups together):
	// a 1M-token prompt in 16-token blocks is 65,536 per group.
	MaxBlockIDs = 1 << 18
	// maxTPSize bounds tp_size.
	maxTPSize = 1 << 16
)

// Params is the kv_transfer_params a NixlConnector prefill engine answers
// (vLLM's request_finished on the prefill node) and the decode engine reads
// (update_state_after_alloc, and the worker's handshake and read: remote
// tp_size, dcp_size and pp_size lay the pulled KV out), every generation in
// the repository's upstream corpus (wirecorpus: the single-file connector
// of 2025, the pull and push schedulers of 2026). remote_request_id is
// absent before NIXL connector version 2; tp_size before it too;
// dcp_size, pp_size, remote_num_tokens, remote_blocks_expiry_time (null
// on a prefill node) and transfer_mode ("pull" or "push") come with the
// 2026 schedulers (push answers no dcp_size); remote_num_cached_tokens is
// the prefill engine's own prefix-cache hit count, where it names one.
// remote_host and remote_port are the prefill engine's NIXL side channel
// (VLLM_NIXL_SIDE_CHANNEL_HOST, VLLM_NIXL_SIDE_CHANNEL_PORT plus its
// data-parallel rank), which the decode engine connects to. The schema is
// Open: a member a later vLLM adds passes when it names no address
// (connectors.Passable), counted by the proxy.
var Params = connectors.Schema{Name: "kv_transfer_params", Open: true, Fields: []connectors.Field{
	{Name: "do_remote_prefill", Kind: connectors.KindBool, Required: true},
	{Name: "do_remote_decode", Kind: connectors.KindBool},
	{Name: "remote_block_ids", Kind: connectors.KindBlockIDs, Required: true, Max: MaxBlockIDs},
	{Name: "remote_engine_id", Kind: connectors.KindID, Required: true},
	{Name: "remote_request_id", Kind: connectors.KindID},
	{Name: "remote_host", Kind: connectors.KindHost, Required: true, Role: connectors.RoleHost},
	{Name: "remote_port", Kind: connectors.KindInt, Required: true, Min: 1, Max: 65535, Role: connectors.RolePort},
	{Name: "tp_size", Kind: connectors.KindInt, Min: 1, Max: maxTPSize},
	{Name: "dcp_size", Kind: connectors.KindInt, Min: 1, Max: maxTPSize},
	{Name: "pp_size", Kind: connectors.KindInt, Min: 1, Max: maxTPSize},
	{Name: "remote_num_tokens", Kind: connectors.KindInt, Min: 0, Max: math.MaxInt32},
	{Name: "remote_blocks_expiry_time", Kind: connectors.KindNumber},
	{Name: "transfer_mode", Kind: connectors.KindID, Max: 16},
	{Name: "remote_num_cached_tokens", Kind: connectors.KindInt, Min: 0, Max: math.MaxInt32},
	// vllm-ascend's MooncakeConnector (kv_p2p), driven as NIXL is: its
	// prefill node's context-, decode-context- and tensor-parallel sizes,
	// block size and prompt blocks, the last prompt token, and the other
	// nodes of a multi-node prefill instance (their hosts checked as the
	// side channel's).
	{Name: "remote_pcp_size", Kind: connectors.KindInt, Min: 1, Max: maxTPSize},
	{Name: "remote_dcp_size", Kind: connectors.KindInt, Min: 1, Max: maxTPSize},
	{Name: "remote_ptp_size", Kind: connectors.KindInt, Min: 1, Max: maxTPSize},
	{Name: "remote_block_size", Kind: connectors.KindInt, Min: 1, Max: math.MaxInt32},
	{Name: "num_prompt_blocks", Kind: connectors.KindInt, Min: 0, Max: MaxBlockIDs},
	{Name: "last_token_id", Kind: connectors.KindInt, Min: 0, Max: math.MaxInt32},
	{Name: "remote_multi_nodes_meta_mapping", Kind: connectors.KindMap, Max: maxNodes, Sub: &nodeMeta},
}}

// maxNodes bounds the nodes of remote_multi_nodes_meta_mapping.
const maxNodes = 256

// nodeMeta is one node of vllm-ascend's remote_multi_nodes_meta_mapping.
var nodeMeta = connectors.Schema{Name: "kv_transfer_params.remote_multi_nodes_meta_mapping", Fields: []connectors.Field{
	{Name: "host", Kind: connectors.KindHost, Required: true, Role: connectors.RoleHost},
	{Name: "engine_id", Kind: connectors.KindID, Required: true},
	{Name: "handshake_port", Kind: connectors.KindInt, Required: true, Min: 1, Max: 65535, Role: connectors.RolePort},
}}

// HistoryParams is the kv_transfer_params a NixlConnector decode engine
// answers with bidirectional_kv_xfer on (vLLM's pull scheduler,
// request_finished on the decode node): the blocks it pinned for the
// request's prompt and output (prompt + generated tokens, reasoning
// included), for the conversation's next prefill to pull instead of
// computing them again. do_remote_decode is true and do_remote_prefill
// false: the params are put in the next prefill leg as they are.
// remote_num_tokens is the tokens the blocks hold; remote_blocks_expiry_time
// is the decode engine's deadline on its own monotonic clock (the prefill
// engine declines a read close to it); remote_host and remote_port are the
// decode engine's NIXL side channel, which the prefill engine connects to.
var HistoryParams = connectors.Schema{Name: "kv_transfer_params", Open: true, Fields: []connectors.Field{
	{Name: "do_remote_prefill", Kind: connectors.KindBool, Required: true},
	{Name: "do_remote_decode", Kind: connectors.KindBool, Required: true},
	{Name: "remote_block_ids", Kind: connectors.KindBlockIDs, Required: true, Max: MaxBlockIDs},
	{Name: "remote_engine_id", Kind: connectors.KindID, Required: true},
	{Name: "remote_request_id", Kind: connectors.KindID, Required: true},
	{Name: "remote_host", Kind: connectors.KindHost, Required: true, Role: connectors.RoleHost},
	{Name: "remote_port", Kind: connectors.KindInt, Required: true, Min: 1, Max: 65535, Role: connectors.RolePort},
	{Name: "tp_size", Kind: connectors.KindInt, Min: 1, Max: maxTPSize},
	{Name: "dcp_size", Kind: connectors.KindInt, Min: 1, Max: maxTPSize},
	{Name: "pp_size", Kind: connectors.KindInt, Min: 1, Max: maxTPSize},
	{Name: "remote_num_tokens", Kind: connectors.KindInt, Required: true, Min: 1, Max: math.MaxInt32},
	{Name: "remote_blocks_expiry_time", Kind: connectors.KindNumber},
	{Name: "transfer_mode", Kind: connectors.KindID, Max: 16},
}}
