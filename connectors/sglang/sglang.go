// Package sglang is SGLang's P/D wire protocol: both legs carry the client
// body plus bootstrap_host (the prefiller's host), bootstrap_port and a
// random 63-bit bootstrap_room, and are sent at once; the decode engine
// waits for the room on the prefiller's bootstrap server and pulls the KV
// itself.
package sglang

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// Name is the --kv-connector value of this connector.
const Name = "sglang"

// DefaultBootstrapPort is SGLang's default disaggregation bootstrap port.
const DefaultBootstrapPort = 8998

// Connector is the SGLang connector. Create it with New.
type Connector struct {
	port []byte // bootstrap_port, as JSON
}

// New returns an SGLang connector that names bootstrapPort on both legs.
func New(bootstrapPort int) *Connector {
	return &Connector{port: strconv.AppendInt(nil, int64(bootstrapPort), 10)}
}

// Name returns "sglang".
func (*Connector) Name() string { return Name }

// Legs returns one body for both legs: the client body with bootstrap_host,
// bootstrap_port and bootstrap_room set. No token cap: an SGLang prefill
// server generates one token by itself. A request asking for n > 1
// sequences is refused (ErrUnsupportedRequest): SGLang puts them all in one
// room and the decode hangs.
func (c *Connector) Legs(api connectors.API, body []byte, pr connectors.Pairing) ([]byte, []byte, error) {
	js := connectors.Bytes(body)
	n := gjson.Get(js, "n")
	if api == connectors.APIGenerate {
		n = gjson.Get(js, "sampling_params.n")
	}
	if n.Type == gjson.Number && n.Int() > 1 {
		return nil, nil, fmt.Errorf("%w: n=%d: SGLang shares one bootstrap room among the n sequences and the decode hangs; send n=1, or omit x-prefiller-host-port to run locally",
			connectors.ErrUnsupportedRequest, n.Int())
	}
	edits := [3]connectors.Edit{
		{Key: "bootstrap_host", Raw: strconv.AppendQuote(nil, BootstrapHost(pr.PrefillHost))},
		{Key: "bootstrap_port", Raw: c.port},
		{Key: "bootstrap_room", Raw: strconv.AppendUint(nil, pr.Room, 10)},
	}
	out, err := connectors.EditObject(nil, body, edits[:])
	if err != nil {
		return nil, nil, err
	}
	return out, out, nil
}

// BootstrapHost is host as bootstrap_host carries it: an IPv6 address in
// brackets, as SGLang's own mini load balancer writes it (mini_lb.py,
// wirecorpus shape sglang-bootstrap-ipv6): the decode engine joins
// f"{bootstrap_host}:{bootstrap_port}", which a bare IPv6 address turns
// into no address at all. Newer decode engines strip the brackets and add
// them again, so the bracketed form serves both.
func BootstrapHost(host string) string {
	if strings.IndexByte(host, ':') >= 0 && !strings.HasPrefix(host, "[") {
		return "[" + host + "]"
	}
	return host
}

// RewriteAnswer sets the decode answer's prompt cached-token count to 0: the
// decoder received the whole prompt's KV from the prefiller and would report
// it all cached, and the prefill answer (which arrives after the decode
// started) is not waited for.
func (*Connector) RewriteAnswer(api connectors.API, data []byte, h connectors.Handoff) []byte {
	return connectors.RewriteCachedTokens(api, data, h.CachedTokens)
}

var (
	_ connectors.Concurrent     = (*Connector)(nil)
	_ connectors.AnswerRewriter = (*Connector)(nil)
)
