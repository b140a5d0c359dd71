package sidecar

import (
	"math"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
)

// Source is the kv_source descriptor a prefill engine answers
// (CONTRACT.md, 2; kvtransfer.Source): the only members the sidecar reads.
// agent is the host:port of the prefill engine's kvtransfer agent, which
// the sidecar itself connects to.
var Source = connectors.Schema{Name: "kv_source", Fields: []connectors.Field{
	{Name: "agent", Kind: connectors.KindHostPort, Required: true, Role: connectors.RoleAddr},
	{Name: "transport", Kind: connectors.KindID, Required: true, Max: 16},
	{Name: "engine_id", Kind: connectors.KindID, Required: true},
	{Name: "request_id", Kind: connectors.KindID, Required: true},
	{Name: "block_ids", Kind: connectors.KindInts, Required: true, Min: 0, Max: nixlv2.MaxBlockIDs},
	{Name: "block_bytes", Kind: connectors.KindInt, Required: true, Min: 1, Max: 1 << 30},
	{Name: "num_tokens", Kind: connectors.KindInt, Required: true, Min: 1, Max: math.MaxInt32},
	{Name: "checksums", Kind: connectors.KindUints, Max: nixlv2.MaxBlockIDs},
	{Name: "lease_ms", Kind: connectors.KindInt, Min: 0, Max: math.MaxInt32},
}}

// Params is the kv_transfer_params of a sidecar-pull prefill answer: the
// NIXL members an engine may answer beside kv_source (none of them is
// handed on, and none names an address the sidecar connects to) and the
// kv_source descriptor. It is Open, as nixlv2.Params is: a member a newer
// engine adds passes when it names no address.
var Params = connectors.Schema{Name: "kv_transfer_params", Open: true, Fields: []connectors.Field{
	{Name: "do_remote_prefill", Kind: connectors.KindBool},
	{Name: "do_remote_decode", Kind: connectors.KindBool},
	{Name: "remote_block_ids", Kind: connectors.KindBlockIDs, Max: nixlv2.MaxBlockIDs},
	{Name: "remote_engine_id", Kind: connectors.KindID},
	{Name: "remote_request_id", Kind: connectors.KindID},
	{Name: "remote_host", Kind: connectors.KindHost},
	{Name: "remote_port", Kind: connectors.KindInt, Min: 0, Max: 65535},
	{Name: "tp_size", Kind: connectors.KindInt, Min: 1, Max: 1 << 16},
	{Name: "remote_num_tokens", Kind: connectors.KindInt, Min: 0, Max: math.MaxInt32},
	{Name: "dcp_size", Kind: connectors.KindInt, Min: 1, Max: 1 << 16},
	{Name: "pp_size", Kind: connectors.KindInt, Min: 1, Max: 1 << 16},
	{Name: "remote_blocks_expiry_time", Kind: connectors.KindNumber},
	{Name: "transfer_mode", Kind: connectors.KindID, Max: 16},
	{Name: "kv_source", Kind: connectors.KindObject, Required: true, Sub: &Source},
}}
