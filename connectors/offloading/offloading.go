// Package offloading is the wire protocol of vLLM's OffloadingConnector P2P
// tier, as llm-d's sidecar speaks it: both legs are sent at once. The
// prefill leg asks the prefill engine to compute the prompt (one token) and
// hold its blocks under a fresh kv_request_id; the decode leg names that id
// and the prefill engine's P2P listener, from which the decode engine pulls
// the blocks itself (waiting for them) before it decodes.
package offloading

import (
	"strconv"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// Name is the --kv-connector value of this connector.
const Name = "offloading"

// Connector is the offloading connector. The zero value is ready to use.
type Connector struct{}

// New returns an offloading connector.
func New() *Connector { return &Connector{} }

// Name returns "offloading".
func (*Connector) Name() string { return Name }

// Legs returns the two legs' bodies. The prefill leg is the client body
// capped to one non-streamed token (connectors.PrefillCapEdits) with
// kv_transfer_params {"remote_decoder":{"kv_request_id":id}}, plus
// remote_kv_source when pr names a source. The decode leg is the client
// body unchanged but for kv_transfer_params {"remote_prefiller":
// {"kv_request_id":id,"remote_host":prefill host,"remote_port":its P2P
// port}}.
func (*Connector) Legs(api connectors.API, body []byte, pr connectors.Pairing) ([]byte, []byte, error) {
	params := append([]byte(`{"remote_decoder":{"kv_request_id":`), strconv.Quote(pr.KVRequestID)...)
	params = append(params, '}')
	if pr.Source != nil {
		params = append(params, `,"remote_kv_source":`...)
		params = pr.Source.AppendJSON(params)
	}
	params = append(params, '}')
	var buf [10]connectors.Edit
	edits := connectors.PrefillCapEdits(buf[:0], api)
	edits = append(edits, connectors.Edit{Key: "kv_transfer_params", Raw: params})
	pre, err := connectors.EditObject(nil, body, edits)
	if err != nil {
		return nil, nil, err
	}
	from := connectors.P2PPeer{RequestID: pr.KVRequestID, Host: pr.PrefillHost, Port: pr.PrefillP2PPort}
	dparams := append([]byte(`{"remote_prefiller":`), from.AppendJSON(nil)...)
	dparams = append(dparams, '}')
	dec, err := connectors.EditObject(nil, body, []connectors.Edit{{Key: "kv_transfer_params", Raw: dparams}})
	if err != nil {
		return nil, nil, err
	}
	return pre, dec, nil
}

var _ connectors.Concurrent = (*Connector)(nil)
