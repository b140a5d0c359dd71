// Package moriio holds the body shapes of AMD's MoRI-IO KV transfer engine
// in write mode, on top of the nixlv2 connector: the prefill engine writes
// (pushes) the prompt's KV into the decode engine, which the
// kv_transfer_params of each leg arrange. Like every connector it is a pure
// transform: no sockets, no logging, no metrics; the proxy resolves the
// hosts and runs the legs.
package moriio

import (
	"encoding/binary"
	"strconv"

	"github.com/tidwall/gjson"
	"golang.org/x/crypto/blake2s"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// HeaderRank is the header that pins a leg to one data-parallel rank of
// its engine when the data-parallel size is above 1.
const HeaderRank = "x-data-parallel-rank"

// Ports and sizes of a MoRI-IO deployment (llm-d's --moriio-* flags).
type Ports struct {
	DecodeNotify, DecodeHandshake   int
	PrefillNotify, PrefillHandshake int
	TPSize, DPSize, DPSizeLocal     int
}

// PickRank is the data-parallel rank of the request id: the first 8 bytes
// of its BLAKE2s-256 digest, big-endian, modulo dpSize (0 when dpSize <= 1).
// Both legs of a request, and llm-d's sidecar, agree on it.
func PickRank(id string, dpSize int) int {
	if dpSize <= 1 {
		return 0
	}
	sum := blake2s.Sum256([]byte(id))
	return int(binary.BigEndian.Uint64(sum[:8]) % uint64(dpSize))
}

// TransferID is the write-mode transfer id of request id: "tx" + id.
func TransferID(id string) string { return "tx" + id }

// Leg is what one request's legs share.
type Leg struct {
	// Rank is the data-parallel rank both legs are pinned to.
	Rank int
	// TransferID names the pushed KV (TransferID of the request id).
	TransferID string
}

// obj builds a JSON object member by member, in order.
type obj []byte

func (o obj) key(k string) obj {
	if len(o) > 1 {
		o = append(o, ',')
	}
	o = strconv.AppendQuote(o, k)
	return append(o, ':')
}

func (o obj) raw(k, v string) obj     { return append(o.key(k), v...) }
func (o obj) num(k string, v int) obj { return strconv.AppendInt(o.key(k), int64(v), 10) }
func (o obj) str(k, v string) obj     { return strconv.AppendQuote(o.key(k), v) }

func (o obj) strs(k string, v []string) obj { return appendStrings(o.key(k), v) }

// appendStrings appends v as a JSON array of strings.
func appendStrings(dst []byte, v []string) []byte {
	dst = append(dst, '[')
	for i, s := range v {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendQuote(dst, s)
	}
	return append(dst, ']')
}

// hosts adds the wide-EP host list and the ranks per host.
func (o obj) hosts(hosts []string, p Ports) obj {
	if len(hosts) == 0 {
		return o
	}
	o = o.strs("remote_hosts", hosts)
	if p.DPSizeLocal > 0 {
		o = o.num("remote_dp_size_local", p.DPSizeLocal)
	}
	return o
}

// PrefillParams is the prefill leg's kv_transfer_params in write mode: the
// prefill engine writes the prompt's KV into decodeHost's engine (its
// notify and handshake ports), rank l.Rank, under l.TransferID.
// decodeHosts, when set, are the wide-EP decode hosts' IPs.
func PrefillParams(p Ports, decodeHost string, l Leg, decodeHosts []string) []byte {
	o := obj(make([]byte, 0, 512))
	o = append(o, '{')
	o = o.raw("do_remote_decode", "true").raw("do_remote_prefill", "false").
		raw("remote_engine_id", "null").raw("remote_block_ids", "null").
		str("remote_host", decodeHost).raw("remote_port", "null").
		num("remote_notify_port", p.DecodeNotify).num("remote_dp_rank", l.Rank).
		raw("remote_dp_rank_override", "true").num("remote_handshake_port", p.DecodeHandshake).
		str("transfer_id", l.TransferID).num("tp_size", p.TPSize).num("remote_dp_size", p.DPSize)
	o = o.hosts(decodeHosts, p)
	return append(o, '}')
}

// ParallelDecodeParams is the decode leg's kv_transfer_params in parallel
// dispatch, written before the prefill answered: the decode engine waits
// for prefillHost's engine to write the KV under l.TransferID.
// prefillHosts, when set, are the wide-EP prefill hosts' IPs.
func ParallelDecodeParams(p Ports, prefillHost string, l Leg, prefillHosts []string) []byte {
	engine := prefillHost + ":" + strconv.Itoa(p.PrefillHandshake)
	o := obj(make([]byte, 0, 512))
	o = append(o, '{')
	o = o.raw("do_remote_prefill", "true").raw("do_remote_decode", "false").
		str("remote_engine_id", engine).raw("remote_block_ids", "[]").
		str("remote_host", prefillHost).num("remote_port", p.PrefillHandshake).
		num("remote_notify_port", p.PrefillNotify).num("remote_dp_rank", l.Rank).
		raw("remote_dp_rank_override", "true").num("remote_handshake_port", p.PrefillHandshake).
		str("transfer_id", l.TransferID).num("tp_size", p.TPSize).num("remote_dp_size", p.DPSize)
	o = o.hosts(prefillHosts, p)
	return append(o, '}')
}

// DecodeRank is the serial decode leg's rank: the remote_dp_rank the
// prefill answer returned when it is an integer in [0, dpSize), else
// fallback (the request id's PickRank).
func DecodeRank(returned []byte, dpSize, fallback int) int {
	v := gjson.GetBytes(returned, "remote_dp_rank")
	if v.Type != gjson.Number {
		return fallback
	}
	f := v.Float()
	if n := int(f); float64(n) == f && n >= 0 && n < dpSize {
		return n
	}
	return fallback
}

// SerialDecodeParams is the serial decode leg's kv_transfer_params: the
// prefill answer's, with the rank written back (remote_dp_rank,
// remote_dp_rank_override) and, only where absent, transfer_id, the decode
// notify and handshake ports, remote_dp_size and the wide-EP prefill hosts
// (remoteHosts' IPs) filled in.
func SerialDecodeParams(returned []byte, p Ports, l Leg, remoteHosts []string) ([]byte, error) {
	if !connectors.IsObject(returned) {
		return nil, connectors.ErrInvalidKVParams
	}
	has := func(k string) bool { return gjson.GetBytes(returned, k).Exists() }
	edits := []connectors.Edit{
		{Key: "remote_dp_rank", Raw: strconv.AppendInt(nil, int64(l.Rank), 10)},
		{Key: "remote_dp_rank_override", Raw: []byte("true")},
	}
	add := func(k string, v []byte) {
		if !has(k) {
			edits = append(edits, connectors.Edit{Key: k, Raw: v})
		}
	}
	add("transfer_id", strconv.AppendQuote(nil, l.TransferID))
	add("remote_notify_port", strconv.AppendInt(nil, int64(p.DecodeNotify), 10))
	add("remote_handshake_port", strconv.AppendInt(nil, int64(p.DecodeHandshake), 10))
	add("remote_dp_size", strconv.AppendInt(nil, int64(p.DPSize), 10))
	if len(remoteHosts) > 0 {
		add("remote_hosts", appendStrings(nil, remoteHosts))
		if p.DPSizeLocal > 0 {
			add("remote_dp_size_local", strconv.AppendInt(nil, int64(p.DPSizeLocal), 10))
		}
	}
	return connectors.EditObject(nil, returned, edits)
}

var one = []byte("1")

// ParallelPrefillBody is the prefill leg's body in parallel dispatch: the
// client body with stream false, stream_options removed, every token cap
// (max_tokens, max_completion_tokens, max_output_tokens, min_tokens) set to
// 1 at the top level whatever the API, as llm-d does, and params.
func ParallelPrefillBody(body, params []byte) ([]byte, error) {
	return connectors.EditObject(nil, body, []connectors.Edit{
		{Key: "stream", Raw: []byte("false")},
		{Key: "stream_options", Delete: true},
		{Key: "max_tokens", Raw: one},
		{Key: "max_completion_tokens", Raw: one},
		{Key: "max_output_tokens", Raw: one},
		{Key: "min_tokens", Raw: one},
		{Key: "kv_transfer_params", Raw: params},
	})
}

// WithParams returns body with its kv_transfer_params replaced by params.
func WithParams(body, params []byte) ([]byte, error) {
	return connectors.EditObject(nil, body, []connectors.Edit{{Key: "kv_transfer_params", Raw: params}})
}
