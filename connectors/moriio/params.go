package moriio

import (
	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
)

// maxHosts bounds remote_hosts (a multi-node TP group's hosts).
const maxHosts = 64

// Params is the kv_transfer_params a MoRI-IO prefill engine answers
// (vLLM's MoRIIOConnectorScheduler.request_finished: the block ids, its
// engine id, remote_host with its handshake and notify ports, the
// data-parallel size, tp_size, transfer_id, and in multi-node TP
// remote_hosts), plus what the sidecar's own write-mode legs carry back
// (remote_port, remote_dp_rank and its override, remote_dp_size_local,
// remote_request_id) and prefill_complete_ts (a timestamp some builds
// add). The decode engine connects to remote_host and every remote_hosts
// entry, at the ports named.
var Params = connectors.Schema{Name: "kv_transfer_params", Fields: []connectors.Field{
	{Name: "do_remote_prefill", Kind: connectors.KindBool, Required: true},
	{Name: "do_remote_decode", Kind: connectors.KindBool},
	{Name: "remote_block_ids", Kind: connectors.KindBlockIDs, Max: nixlv2.MaxBlockIDs},
	{Name: "remote_engine_id", Kind: connectors.KindID},
	{Name: "remote_request_id", Kind: connectors.KindID},
	{Name: "remote_host", Kind: connectors.KindHost, Required: true, Role: connectors.RoleHost},
	{Name: "remote_port", Kind: connectors.KindInt, Min: 0, Max: 65535, Role: connectors.RolePort},
	{Name: "remote_handshake_port", Kind: connectors.KindInt, Min: 0, Max: 65535, Role: connectors.RolePort},
	{Name: "remote_notify_port", Kind: connectors.KindInt, Min: 0, Max: 65535, Role: connectors.RolePort},
	{Name: "remote_dp_size", Kind: connectors.KindInt, Min: 1, Max: 1 << 16},
	{Name: "remote_dp_rank", Kind: connectors.KindInt, Min: 0, Max: 1<<16 - 1},
	{Name: "remote_dp_rank_override", Kind: connectors.KindBool},
	{Name: "remote_dp_size_local", Kind: connectors.KindInt, Min: 0, Max: 1 << 16},
	{Name: "tp_size", Kind: connectors.KindInt, Min: 1, Max: 1 << 16},
	{Name: "transfer_id", Kind: connectors.KindID},
	{Name: "remote_hosts", Kind: connectors.KindHosts, Max: maxHosts, Role: connectors.RoleHost},
	{Name: "prefill_complete_ts", Kind: connectors.KindNumber},
}}

// Handoffs is a sequential connector (nixlv2) whose prefill answers are
// read as MoRI-IO write mode's (Params); everything else is the wrapped
// connector's.
type Handoffs struct {
	connectors.Sequential
}

// ReadHandoffs returns seq reading MoRI-IO's prefill answers.
func ReadHandoffs(seq connectors.Sequential) *Handoffs { return &Handoffs{Sequential: seq} }

// ParsePrefill reads the handoff of a MoRI-IO prefill answer: its
// kv_transfer_params against Params, written anew, with the addresses
// they name.
func (*Handoffs) ParsePrefill(api connectors.API, answer []byte) (connectors.Handoff, error) {
	h, p, ok, err := connectors.PrefillParams(api, answer)
	if !ok {
		return h, err
	}
	return connectors.ReadHandoff(h, p, &Params)
}

var _ connectors.Sequential = (*Handoffs)(nil)
