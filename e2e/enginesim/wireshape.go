package enginesim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/pd-sidecar/pd-sidecar/wirecorpus"
)

// The NIXL wire shape this engine speaks (--wire-shape): a prefill answer
// of the repository's upstream corpus (wirecorpus). A prefill writes
// exactly that shape's members — its own values for those that say where
// and what the KV is (engine and request ids, block ids flat or per KV
// group as the shape has them, side-channel host and port, tp_size,
// dcp_size, pp_size, token counts), the shape's own for the rest
// (transfer_mode, vllm-ascend's sizes) — and a decode reads it as that
// generation's decode side does: it prefills locally (counted in
// sim_invalid_kv_params_total, as vLLM logs "Got invalid KVTransferParams")
// when a member that side requires is missing, and also when a member the
// prefill wrote and that side reads is (vLLM would fall back on a default
// and lay the KV out wrong: dcp_size, pp_size), so a proxy that drops one
// fails a test as it would fail a real engine. Without remote_request_id
// (the oldest generation) the prefill holds the blocks under the request's
// own id, which the decode leg shares.
//
// llm-d-inference-sim's shape is its placeholders (remote_block_ids
// ["DUMMY_ID"], remote_host "DUMMY"): a prefill answers them as they are,
// and a decode that carries do_remote_prefill with placeholder block ids
// skips the prefill's cost without pulling anything
// (sim_placeholder_kv_decodes_total), as that simulator does; integer
// block ids, which its typed parse refuses, count as invalid.

// DefaultWireShape is the newest vLLM NIXL pull shape.
const DefaultWireShape = "vllm-nixl-pull-0050936b"

// wireShape is a corpus shape as this engine writes and reads it.
type wireShape struct {
	name string
	// order and tmpl are the shape's members and values.
	order []string
	tmpl  map[string]json.RawMessage
	// placeholder: llm-d-inference-sim's fixed answer.
	placeholder bool
	// grouped: remote_block_ids per KV group.
	grouped bool
	// requires are the members the decode side requires; reads those it
	// reads that the shape writes.
	requires, reads []string
}

// loadWireShape reads the corpus shape name, which must be a NIXL prefill
// answer.
func loadWireShape(name string) (*wireShape, error) {
	s, err := wirecorpus.Get(name)
	if err != nil {
		return nil, err
	}
	if s.Connector != "nixlv2" || s.Message != wirecorpus.PrefillAnswer {
		return nil, fmt.Errorf("--wire-shape %s is a %s %s, not a nixlv2 prefill answer", name, s.Connector, s.Message)
	}
	w := &wireShape{name: name, order: s.Members(), placeholder: s.Engine == "llm-d-inference-sim"}
	if err := json.Unmarshal(s.Value, &w.tmpl); err != nil {
		return nil, err
	}
	var ids []json.RawMessage
	if err := json.Unmarshal(w.tmpl["remote_block_ids"], &ids); err == nil && len(ids) > 0 {
		w.grouped = bytes.HasPrefix(bytes.TrimSpace(ids[0]), []byte("["))
	}
	w.requires = s.DecodeReads.Requires
	for _, m := range s.DecodeReads.Members {
		if _, ok := w.tmpl[m]; ok {
			w.reads = append(w.reads, m)
		}
	}
	return w, nil
}

// WireShapes lists the shapes --wire-shape takes.
func WireShapes() []string {
	shapes, _ := wirecorpus.Select("nixlv2", wirecorpus.PrefillAnswer)
	var out []string
	for _, s := range shapes {
		out = append(out, s.Name)
	}
	return out
}

// has reports whether the shape writes member m.
func (w *wireShape) has(m string) bool { _, ok := w.tmpl[m]; return ok }

// prefillValues are the values a prefill answer's params take.
type prefillValues struct {
	engineID, requestID, host string
	port, tokens, cached      int
	blockIDs                  []int
	tp, dcp, pp               int
}

// params writes the shape's members with v's values.
func (w *wireShape) params(v prefillValues) map[string]any {
	out := make(map[string]any, len(w.tmpl))
	for k, raw := range w.tmpl {
		out[k] = raw
	}
	if w.placeholder {
		return out
	}
	set := func(k string, x any) {
		if w.has(k) {
			out[k] = x
		}
	}
	set("do_remote_prefill", true)
	set("do_remote_decode", false)
	set("remote_engine_id", v.engineID)
	set("remote_request_id", v.requestID)
	if w.grouped {
		out["remote_block_ids"] = [][]int{v.blockIDs}
	} else {
		out["remote_block_ids"] = v.blockIDs
	}
	set("remote_host", v.host)
	set("remote_port", v.port)
	set("tp_size", v.tp)
	set("dcp_size", v.dcp)
	set("pp_size", v.pp)
	set("remote_num_tokens", v.tokens)
	set("remote_blocks_expiry_time", nil)
	set("remote_num_cached_tokens", v.cached)
	set("num_prompt_blocks", len(v.blockIDs))
	if w.has("remote_multi_nodes_meta_mapping") {
		out["remote_multi_nodes_meta_mapping"] = map[string]any{"0": map[string]any{"host": v.host, "engine_id": v.engineID, "handshake_port": v.port}}
	}
	return out
}

// invalidDecode says why a NIXL decode request's params raw cannot drive
// a decode on remote KV, read as the shape's decode side reads them; ""
// when they can.
func (w *wireShape) invalidDecode(p *kvParams, raw map[string]json.RawMessage) string {
	if w.placeholder {
		var ids []string
		if err := json.Unmarshal(raw["remote_block_ids"], &ids); err != nil {
			return "remote_block_ids: not the placeholder strings llm-d-inference-sim reads"
		}
		return ""
	}
	var missing []string
	for _, m := range w.requires {
		if absent(raw[m]) {
			missing = append(missing, m)
		}
	}
	for _, m := range w.reads {
		if _, ok := raw[m]; !ok && !slices.Contains(missing, m) {
			missing = append(missing, m)
		}
	}
	if len(missing) > 0 {
		return "missing " + strings.Join(missing, ", ") + " (read by the decode side of " + w.name + ")"
	}
	if p.RemoteEngineID == nil || p.RemoteHost == nil || p.RemotePort == nil || *p.RemotePort <= 0 {
		return "remote_engine_id, remote_host and remote_port are required to pull"
	}
	if _, err := p.blockIDs(); err != nil {
		return err.Error()
	}
	return ""
}

// placeholderDecode reports whether g is a decode this engine serves as
// llm-d-inference-sim does: placeholder params, nothing to pull.
func (s *Sim) placeholderDecode(g *genRequest) bool {
	return s.shape.placeholder && g.isNIXL() && g.kv.DoRemotePrefill && g.p2pPrefiller() == nil && g.boot == nil
}

// isNIXL reports whether g carries NixlConnector params: not Mooncake's or
// MoRI-IO's (transfer_id, remote_notify_port), nor the sidecar's own
// pre-loaded blocks.
func (g *genRequest) isNIXL() bool {
	return g.kv != nil && g.kv.TransferID == nil && g.kv.RemoteNotifyPort == nil && g.kv.Preloaded == nil
}

// countLayout counts the prefill engine's layout a NIXL decode's params
// named.
func (s *Sim) countLayout(g *genRequest) {
	if g.kvRaw == nil || !g.isNIXL() {
		return
	}
	label := func(m string) string {
		if raw, ok := g.kvRaw[m]; ok && !absent(raw) {
			return string(raw)
		}
		return ""
	}
	s.m.remoteLayouts.WithLabelValues(label("tp_size"), label("dcp_size"), label("pp_size")).Inc()
}
