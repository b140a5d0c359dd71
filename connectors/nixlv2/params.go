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
// (vLLM's NixlConnectorScheduler.request_finished) and the decode engine
// reads (update_state_after_alloc; RemoteMeta): the only members a decode
// leg carries. remote_request_id is absent in vLLM before NIXL connector
// version 2, remote_num_tokens in all but the newest; tp_size is the
// prefill engine's tensor-parallel size. remote_host and remote_port are
// the prefill engine's NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_HOST,
// VLLM_NIXL_SIDE_CHANNEL_PORT plus its data-parallel rank), which the
// decode engine connects to.
var Params = connectors.Schema{Name: "kv_transfer_params", Fields: []connectors.Field{
	{Name: "do_remote_prefill", Kind: connectors.KindBool, Required: true},
	{Name: "do_remote_decode", Kind: connectors.KindBool},
	{Name: "remote_block_ids", Kind: connectors.KindBlockIDs, Required: true, Max: MaxBlockIDs},
	{Name: "remote_engine_id", Kind: connectors.KindID, Required: true},
	{Name: "remote_request_id", Kind: connectors.KindID},
	{Name: "remote_host", Kind: connectors.KindHost, Required: true, Role: connectors.RoleHost},
	{Name: "remote_port", Kind: connectors.KindInt, Required: true, Min: 1, Max: 65535, Role: connectors.RolePort},
	{Name: "tp_size", Kind: connectors.KindInt, Min: 1, Max: maxTPSize},
	{Name: "remote_num_tokens", Kind: connectors.KindInt, Min: 0, Max: math.MaxInt32},
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
var HistoryParams = connectors.Schema{Name: "kv_transfer_params", Fields: []connectors.Field{
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
