package connectors

import (
	"strconv"

	"github.com/tidwall/gjson"
)

// P2PPeer names one engine's P2P KV tier (vLLM's OffloadingConnector P2P
// tier) and the transfer on it: the kv_request_id under which the blocks
// are held or looked up, and the host and port of its P2P listener. It is
// the value of the remote_prefiller and remote_kv_source sub-dicts of
// kv_transfer_params.
type P2PPeer struct {
	RequestID string
	Host      string
	Port      int
}

// AppendJSON appends the peer as the JSON object engines read:
// {"kv_request_id":…,"remote_host":…,"remote_port":…}.
func (p P2PPeer) AppendJSON(dst []byte) []byte {
	dst = append(dst, `{"kv_request_id":`...)
	dst = strconv.AppendQuote(dst, p.RequestID)
	dst = append(dst, `,"remote_host":`...)
	dst = strconv.AppendQuote(dst, p.Host)
	dst = append(dst, `,"remote_port":`...)
	dst = strconv.AppendInt(dst, int64(p.Port), 10)
	return append(dst, '}')
}

// WithKVSource appends to dst body with src as
// kv_transfer_params.remote_kv_source: added to the body's
// kv_transfer_params object (a prefill leg's), which is created when the
// body has none. The engine that reads it pulls the prompt's cached prefix
// from src before it prefills.
func WithKVSource(dst, body []byte, src P2PPeer) ([]byte, error) {
	raw := src.AppendJSON(nil)
	if gjson.Get(Bytes(body), "kv_transfer_params").IsObject() {
		return EditObject(dst, body, []Edit{{Key: "kv_transfer_params", Nested: []Edit{{Key: "remote_kv_source", Raw: raw}}}})
	}
	return OnlyKVSource(dst, body, src)
}

// OnlyKVSource appends to dst body with kv_transfer_params replaced by
// {"remote_kv_source":src}: a request the local engine serves alone, after
// pulling the prompt's cached prefix from src.
func OnlyKVSource(dst, body []byte, src P2PPeer) ([]byte, error) {
	raw := append([]byte(`{"remote_kv_source":`), src.AppendJSON(nil)...)
	raw = append(raw, '}')
	return EditObject(dst, body, []Edit{{Key: "kv_transfer_params", Raw: raw}})
}
