// Package mooncake is vLLM's MooncakeConnector P/D wire protocol: the
// sidecar asks the prefiller's bootstrap server (GET /query) for its engine
// id, then sends both legs at once, tied by a fresh transfer_id; the decode
// engine fetches the KV from the prefiller through the bootstrap address.
package mooncake

import (
	"fmt"
	"hash/fnv"
	"net"
	"slices"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// Name is the --kv-connector value of this connector.
const Name = "mooncake"

// DefaultBootstrapPort is vLLM's default VLLM_MOONCAKE_BOOTSTRAP_PORT.
const DefaultBootstrapPort = 8998

// Connector is the Mooncake connector. Create it with New.
type Connector struct {
	port string
}

// New returns a Mooncake connector querying bootstrapPort on prefillers.
func New(bootstrapPort int) *Connector {
	return &Connector{port: strconv.Itoa(bootstrapPort)}
}

// Name returns "mooncake".
func (*Connector) Name() string { return Name }

// BootstrapAddr returns prefillHost:--mooncake-bootstrap-port.
func (c *Connector) BootstrapAddr(prefillHost string) string {
	return net.JoinHostPort(prefillHost, c.port)
}

// BootstrapPath returns "/query".
func (*Connector) BootstrapPath() string { return "/query" }

// maxRanks bounds the ranks a bootstrap answer may list.
const maxRanks = 4096

// ParseBootstrap reads the bootstrap server's answer, an object keyed by
// data-parallel rank ({"0":{"engine_id":"..."},...}), and keeps the lowest
// rank that names an engine id. Only the engine ids are read (each an id
// connectors.ValidID takes, as it goes into the decode leg), and the ranks
// (decimal numbers, at most maxRanks of them); an answer that is not a
// well-formed object, or names any other engine id or rank, is
// ErrBadBootstrap. The bootstrap URL the decode engine is given is the
// address the sidecar asked (addr), never one the answer names.
func (*Connector) ParseBootstrap(addr string, answer []byte) (connectors.Bootstrap, error) {
	if connectors.ValidObject(answer) != nil {
		return connectors.Bootstrap{}, fmt.Errorf("%w: not a well-formed JSON object", connectors.ErrBadBootstrap)
	}
	type entry struct{ rank, id string }
	var found []entry
	var err error
	n := 0
	gjson.ParseBytes(answer).ForEach(func(k, v gjson.Result) bool {
		if n++; n > maxRanks {
			err = fmt.Errorf("%w: more than %d ranks", connectors.ErrBadBootstrap, maxRanks)
			return false
		}
		if !validRank(k.Str) {
			err = fmt.Errorf("%w: a rank that is not a decimal number", connectors.ErrBadBootstrap)
			return false
		}
		id := v.Get("engine_id")
		switch {
		case !id.Exists() || id.Type == gjson.Null:
		case id.Type != gjson.String || !connectors.ValidID(id.Str):
			err = fmt.Errorf("%w: an engine_id that is not an id of 1..%d printable ASCII characters", connectors.ErrBadBootstrap, connectors.MaxIDLen)
			return false
		default:
			found = append(found, entry{k.Str, id.Str})
		}
		return true
	})
	if err != nil {
		return connectors.Bootstrap{}, err
	}
	if len(found) == 0 {
		return connectors.Bootstrap{}, fmt.Errorf("%w: no engine_id in the answer", connectors.ErrBadBootstrap)
	}
	slices.SortFunc(found, func(a, b entry) int { return rankLess(a.rank, b.rank) })
	b := connectors.Bootstrap{URL: "http://" + addr, EngineID: found[0].id, Rank: found[0].rank}
	for _, e := range found {
		b.Ranks = append(b.Ranks, connectors.RankEngine{Rank: e.rank, EngineID: e.id})
	}
	return b, nil
}

// pick is the rank a split's legs pair on: with more than one rank, the
// transfer id's hash picks one, so that splits spread over the prefill
// engine's ranks as vLLM's own proxy spreads them; the prefill leg then
// names it (PrefillRank) and the decode leg gets its engine id, which is
// where the prefill ran (vLLM appends _dp<rank> to each rank's engine id).
// With one rank, it is that one and no header is needed.
func pick(pr connectors.Pairing) (connectors.RankEngine, bool) {
	b := pr.Bootstrap
	if len(b.Ranks) < 2 {
		return connectors.RankEngine{Rank: b.Rank, EngineID: b.EngineID}, false
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(pr.TransferID))
	return b.Ranks[h.Sum32()%uint32(len(b.Ranks))], true
}

// PrefillRank is the rank the prefill leg names in X-data-parallel-rank
// when the prefill engine runs more than one ("" otherwise).
func (*Connector) PrefillRank(pr connectors.Pairing) string {
	if r, ok := pick(pr); ok {
		return r.Rank
	}
	return ""
}

// validRank reports whether k is a data-parallel rank: 1..5 digits.
func validRank(k string) bool {
	if len(k) == 0 || len(k) > 5 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < '0' || k[i] > '9' {
			return false
		}
	}
	return true
}

// rankLess orders ranks numerically when they are numbers.
func rankLess(a, b string) int {
	x, errA := strconv.Atoi(a)
	y, errB := strconv.Atoi(b)
	if errA == nil && errB == nil {
		return x - y
	}
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Legs returns the prefill leg (the client body capped to one non-streamed
// token with kv_transfer_params {do_remote_decode:true, transfer_id}) and
// the decode leg (the client body with kv_transfer_params
// {do_remote_prefill:true, transfer_id, remote_bootstrap_addr,
// remote_engine_id}).
func (*Connector) Legs(api connectors.API, body []byte, pr connectors.Pairing) ([]byte, []byte, error) {
	xfer := strconv.AppendQuote(nil, pr.TransferID)
	pp := append([]byte(`{"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":`), xfer...)
	pp = append(pp, '}')
	var buf [10]connectors.Edit
	edits := connectors.PrefillCapEdits(buf[:0], api)
	edits = append(edits, connectors.Edit{Key: "kv_transfer_params", Raw: pp})
	pre, err := connectors.EditObject(nil, body, edits)
	if err != nil {
		return nil, nil, err
	}
	dp := append([]byte(`{"do_remote_prefill":true,"do_remote_decode":false,"transfer_id":`), xfer...)
	dp = append(dp, `,"remote_bootstrap_addr":`...)
	dp = strconv.AppendQuote(dp, pr.Bootstrap.URL)
	dp = append(dp, `,"remote_engine_id":`...)
	rank, _ := pick(pr)
	dp = strconv.AppendQuote(dp, rank.EngineID)
	dp = append(dp, '}')
	dec, err := connectors.EditObject(nil, body, []connectors.Edit{{Key: "kv_transfer_params", Raw: dp}})
	if err != nil {
		return nil, nil, err
	}
	return pre, dec, nil
}

// RewriteAnswer sets the decode answer's prompt cached-token count to the
// handoff's (0: the prefill answer is not waited for), since the decoder got
// the whole prompt's KV remotely and would report it all cached.
func (*Connector) RewriteAnswer(api connectors.API, data []byte, h connectors.Handoff) []byte {
	return connectors.RewriteCachedTokens(api, data, h.CachedTokens)
}

var (
	_ connectors.Concurrent     = (*Connector)(nil)
	_ connectors.Bootstrapper   = (*Connector)(nil)
	_ connectors.PrefillRanker  = (*Connector)(nil)
	_ connectors.AnswerRewriter = (*Connector)(nil)
)
