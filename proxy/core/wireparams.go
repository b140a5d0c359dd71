package core

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

// What a prefill answer's params may carry beyond what the connector
// documents, and which host they may name. Two rules, both applied to the
// handoff before anything connects to it (checkHandoff):
//
//   - Members the connector's schema does not document passed its Open
//     check (connectors.Passable: they name no address). Each is counted
//     (pd_sidecar_kv_params_unknown_members_total{connector,member}) and
//     warned of once, and the handoff is refused (invalid_kv_params) when
//     the operator asked for strict params (--kv-params-unknown-members=refuse).
//   - A side-channel host given as a name (not an IP address) that is not
//     the prefiller's own host, nor allowlisted, is replaced by the
//     prefiller's own host: the host:port the header named and the
//     allowlist admitted, whose engine answered. vLLM's default
//     VLLM_NIXL_SIDE_CHANNEL_HOST is "localhost", llm-d-inference-sim
//     answers "DUMMY", a side channel may be given as the pod's own DNS
//     name: a name the answer chose never reaches the decode engine, which
//     would resolve it in its own pod. An IP address that is not the
//     prefiller's still has to be allowlisted (RefusedAddr).

// KVGenerationError is a refused handoff, with the upstream generation its
// params are of (connectors.Generation), which the fallback's log line
// names. Its message is the refusal's alone: what an upstream named stays
// out of anything a client is answered.
type KVGenerationError struct {
	Err        error
	Generation string
}

func (e *KVGenerationError) Error() string { return e.Err.Error() }
func (e *KVGenerationError) Unwrap() error { return e.Err }

// withGeneration wraps err, a refusal of the kv_transfer_params of the
// prefill answer body, with their generation.
func (p *Sidecar) withGeneration(err error, body []byte) error {
	if !errors.Is(err, connectors.ErrInvalidKVParams) {
		return err
	}
	return &KVGenerationError{Err: err, Generation: connectors.Generation(p.Conn.Name(), gjson.GetBytes(body, "kv_transfer_params"))}
}

// hostMember is the member a handoff names its side-channel host with.
const hostMember = "kv_transfer_params.remote_host"

// wireChecked applies the two rules to h, answered by prefiller
// (host:port): the handoff to go on, or why none can.
func (p *Sidecar) wireChecked(prefiller string, h connectors.Handoff) (connectors.Handoff, error) {
	if len(h.Unknown) > 0 {
		p.countUnknown(h.Unknown, p.Cfg.Guard.RefuseUnknownKVMembers)
		if p.Cfg.Guard.RefuseUnknownKVMembers {
			return h, fmt.Errorf("%w: kv_transfer_params: %d member(s) the %s connector does not document (--kv-params-unknown-members=refuse)",
				connectors.ErrInvalidKVParams, len(h.Unknown), p.Conn.Name())
		}
	}
	return p.replaceNamedHost(prefiller, h)
}

// countUnknown counts each undocumented member, and warns of each the
// first time it is seen (the names are plain identifiers, at most 32 of
// them labelled: metrics.Wire); refused: --kv-params-unknown-members=refuse.
func (p *Sidecar) countUnknown(names []string, refused bool) {
	what := "passed on to the decode engine unchanged (it names no address)"
	if refused {
		what = "refused (--kv-params-unknown-members=refuse): a local prefill"
	}
	w := p.M.Wire
	conn := p.Conn.Name()
	for _, n := range names {
		label, first := w.UnknownMemberNames.Admit(n)
		w.UnknownMembers.WithLabelValues(conn, label).Inc()
		if first {
			p.Log.Warn().Str("connector", conn).Str("member", n).
				Msg("a prefill answer's kv_transfer_params carry a member this connector does not document: " + what + "; a newer engine? see docs/connectors.md#compatibility")
		}
	}
}

// replaceNamedHost replaces h's side-channel host by the prefiller's own
// host when it is a name that is neither, nor allowlisted at its port.
func (p *Sidecar) replaceNamedHost(prefiller string, h connectors.Handoff) (connectors.Handoff, error) {
	own, _, err := net.SplitHostPort(prefiller)
	if err != nil {
		own = prefiller
	}
	for i, a := range h.Addrs {
		if a.Field != hostMember || sameHost(a.Host, own) {
			continue
		}
		if _, err := netip.ParseAddr(a.Host); err == nil {
			continue // an address: RefusedAddr decides
		}
		if al := p.Cfg.Guard.Allowlist; al != nil && a.Port > 0 && al.Allowed(net.JoinHostPort(a.Host, strconv.Itoa(a.Port))) {
			continue
		}
		out, err := sjson.SetBytes(h.Params, "remote_host", own)
		if err != nil {
			return h, fmt.Errorf("%w: %s: %w", connectors.ErrInvalidKVParams, hostMember, err)
		}
		// Every address of the member is the same host at another port.
		addrs := append([]connectors.Addr(nil), h.Addrs...)
		for j := i; j < len(addrs); j++ {
			if addrs[j].Field == hostMember {
				addrs[j].Host = own
			}
		}
		h.Params, h.Addrs = out, addrs
		p.M.Wire.HostsReplaced.WithLabelValues(p.Conn.Name(), "remote_host").Inc()
		break
	}
	return h, nil
}
