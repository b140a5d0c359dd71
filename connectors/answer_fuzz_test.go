package connectors_test

import (
	"bytes"
	"encoding/json"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/mooncake"
	"github.com/pd-sidecar/pd-sidecar/connectors/moriio"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
	"github.com/pd-sidecar/pd-sidecar/connectors/sharedstorage"
	"github.com/pd-sidecar/pd-sidecar/connectors/sidecar"
)

// What each connector may hand on from an upstream's answer, written down
// here apart from the connectors' own schemas: member name -> a check of
// its decoded value (json.Number for numbers).
type memberCheck map[string]func(v any) bool

func isBool(v any) bool { _, ok := v.(bool); return ok }

func isInt(min, max int64) func(any) bool {
	return func(v any) bool {
		n, ok := v.(json.Number)
		if !ok {
			return false
		}
		i, err := strconv.ParseInt(string(n), 10, 64)
		return err == nil && i >= min && i <= max
	}
}

func isNumber(v any) bool { _, ok := v.(json.Number); return ok }

func isID(v any) bool {
	s, ok := v.(string)
	if !ok || s == "" || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' || s[i] == '"' || s[i] == '\\' {
			return false
		}
	}
	return true
}

func isHost(v any) bool {
	s, ok := v.(string)
	return ok && s != "" && len(s) <= 253 && !strings.ContainsAny(s, "/ @?#%\\\"") &&
		(strings.Count(s, ":") == 0 || net.ParseIP(strings.Trim(s, "[]")) != nil)
}

func isHosts(v any) bool {
	a, ok := v.([]any)
	if !ok || len(a) > 64 {
		return false
	}
	for _, h := range a {
		if !isHost(h) {
			return false
		}
	}
	return true
}

func isInts(min int64, max int) func(any) bool {
	return func(v any) bool {
		a, ok := v.([]any)
		if !ok || len(a) > max {
			return false
		}
		for _, x := range a {
			if !isInt(min, 1<<62)(x) {
				return false
			}
		}
		return true
	}
}

func isUints(v any) bool {
	a, ok := v.([]any)
	if !ok {
		return false
	}
	for _, x := range a {
		n, ok := x.(json.Number)
		if _, err := strconv.ParseUint(string(n), 10, 64); !ok || err != nil {
			return false
		}
	}
	return true
}

func isBlockIDs(v any) bool {
	a, ok := v.([]any)
	if !ok {
		return false
	}
	flat := isInts(0, nixlv2.MaxBlockIDs)
	if flat(a) {
		return true
	}
	placeholders := len(a) > 0
	for _, x := range a {
		placeholders = placeholders && isID(x)
	}
	if placeholders {
		return true
	}
	if len(a) > connectors.MaxKVGroups {
		return false
	}
	for _, g := range a {
		if !flat(g) {
			return false
		}
	}
	return true
}

func isHostPort(v any) bool {
	s, ok := v.(string)
	if !ok {
		return false
	}
	h, p, err := net.SplitHostPort(s)
	return err == nil && isHost(h) && isInt(1, 65535)(json.Number(p))
}

var (
	nixlMembers = memberCheck{
		"do_remote_prefill": isBool, "do_remote_decode": isBool, "remote_block_ids": isBlockIDs,
		"remote_engine_id": isID, "remote_request_id": isID, "remote_host": isHost,
		"remote_port": isInt(1, 65535), "tp_size": isInt(1, 1<<16), "remote_num_tokens": isInt(0, 1<<31-1),
		"dcp_size": isInt(1, 1<<16), "pp_size": isInt(1, 1<<16), "remote_blocks_expiry_time": isNumber,
		"transfer_mode": isShortID(16), "remote_num_cached_tokens": isInt(0, 1<<31-1),
		"remote_pcp_size": isInt(1, 1<<16), "remote_dcp_size": isInt(1, 1<<16), "remote_ptp_size": isInt(1, 1<<16),
		"remote_block_size": isInt(1, 1<<31-1), "num_prompt_blocks": isInt(0, nixlv2.MaxBlockIDs), "last_token_id": isInt(0, 1<<31-1),
		"remote_multi_nodes_meta_mapping": isNodeMap,
	}
	moriMembers = memberCheck{
		"do_remote_prefill": isBool, "do_remote_decode": isBool, "remote_block_ids": isBlockIDs,
		"remote_engine_id": isID, "remote_request_id": isID, "remote_host": isHost,
		"remote_port": isInt(0, 65535), "remote_handshake_port": isInt(0, 65535), "remote_notify_port": isInt(0, 65535),
		"remote_dp_size": isInt(1, 1<<16), "remote_dp_rank": isInt(0, 1<<16-1), "remote_dp_rank_override": isBool,
		"remote_dp_size_local": isInt(0, 1<<16), "tp_size": isInt(1, 1<<16), "transfer_id": isID,
		"remote_hosts": isHosts, "prefill_complete_ts": isNumber,
	}
	sourceMembers = memberCheck{
		"agent": isHostPort, "transport": isID, "engine_id": isID, "request_id": isID,
		"block_ids": isInts(0, nixlv2.MaxBlockIDs), "block_bytes": isInt(1, 1<<30), "num_tokens": isInt(1, 1<<31-1),
		"checksums": isUints, "lease_ms": isInt(0, 1<<31-1),
	}
	ecMembers = memberCheck{"peer_host": isHost, "peer_port": isInt(1, 65535), "size_bytes": isInt(0, 1<<40),
		"nixl_agent_metadata_b64": isShortID(1 << 20), "shape": isInts(0, 8), "item_indices": isInts(0, 1<<12), "metadata": namesNoAddress}
)

// isNodeMap is vllm-ascend's remote_multi_nodes_meta_mapping: decimal
// keys, each {host, engine_id, handshake_port}.
func isNodeMap(v any) bool {
	m, ok := v.(map[string]any)
	if !ok {
		return false
	}
	for k, n := range m {
		e, ok := n.(map[string]any)
		if _, err := strconv.Atoi(k); err != nil || !ok || len(e) != 3 || !isHost(e["host"]) || !isID(e["engine_id"]) || !isInt(1, 65535)(e["handshake_port"]) {
			return false
		}
	}
	return true
}

// namesNoAddress reports whether v holds no string that could name an
// address.
func namesNoAddress(v any) bool {
	switch x := v.(type) {
	case string:
		return !couldNameAddress(x)
	case []any:
		for _, e := range x {
			if !namesNoAddress(e) {
				return false
			}
		}
	case map[string]any:
		for _, e := range x {
			if !namesNoAddress(e) {
				return false
			}
		}
	}
	return true
}

// isShortID is an id of at most max bytes.
func isShortID(max int) func(any) bool {
	return func(v any) bool { s, ok := v.(string); return ok && len(s) <= max && isID(v) }
}

// dnsName is a DNS name as a resolver would take one (one label included).
var dnsName = regexp.MustCompile(`^(?i)[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*\.?$`)

// couldNameAddress reports whether s could name an address, read
// independently of connectors.AddressLike: an IP, a DNS name, host:port,
// a URL, or anything with blanks, controls, brackets or a percent sign.
func couldNameAddress(s string) bool {
	if _, err := netip.ParseAddr(strings.Trim(s, "[]")); err == nil {
		return true
	}
	if _, _, err := net.SplitHostPort(s); err == nil {
		return true
	}
	if u, err := url.Parse(s); err == nil && (u.Scheme != "" || u.Host != "") {
		return true
	}
	return strings.ContainsAny(s, " \t\r\n[]%@/:\\\x00") || dnsName.MatchString(strings.TrimSpace(s))
}

// noAddress fails if v, an undocumented member's value, holds a string
// that could name an address.
func noAddress(t *testing.T, what, name string, v any, answer []byte) {
	t.Helper()
	switch x := v.(type) {
	case string:
		if couldNameAddress(x) {
			t.Fatalf("%s: undocumented member %q hands on %q, which could name an address (answer %q)", what, name, x, answer)
		}
	case []any:
		for _, e := range x {
			noAddress(t, what, name, e, answer)
		}
	case map[string]any:
		for _, e := range x {
			noAddress(t, what, name, e, answer)
		}
	}
}

// checkMembers fails unless raw is a JSON object whose members are all in
// want, once each, each passing its check (null: an optional member), but
// for those named in unknown: members an open schema let pass, which hold
// nothing that could name an address.
func checkMembers(t *testing.T, what string, raw []byte, want memberCheck, answer []byte, unknown ...string) map[string]any {
	t.Helper()
	if !json.Valid(raw) {
		t.Fatalf("%s: not valid JSON: %q (answer %q)", what, raw, answer)
	}
	names := map[string]bool{}
	gjson.ParseBytes(raw).ForEach(func(k, _ gjson.Result) bool {
		if names[k.Str] || k.Raw != strconv.Quote(k.Str) {
			t.Fatalf("%s: member %s repeated or escaped: %q (answer %q)", what, k.Raw, raw, answer)
		}
		names[k.Str] = true
		return true
	})
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatalf("%s: %v: %q", what, err, raw)
	}
	for k, v := range m {
		check, ok := want[k]
		if !ok && slices.Contains(unknown, k) {
			noAddress(t, what, k, v, answer)
			continue
		}
		if !ok {
			t.Fatalf("%s: undocumented member %q handed on: %q (answer %q)", what, k, raw, answer)
		}
		if v != nil && !check(v) {
			t.Fatalf("%s: member %q of the wrong type or size: %v (answer %q)", what, k, v, answer)
		}
	}
	return m
}

// namedAddrs are the addresses a params object names, as the engine reads
// them: each of remote_host and remote_hosts at each non-zero port member
// (at 0 when none), and kv_source's agent.
func namedAddrs(m map[string]any) []string {
	var hosts []string
	var out []string
	for _, k := range []string{"remote_host", "peer_host"} {
		if h, ok := m[k].(string); ok {
			hosts = append(hosts, strings.Trim(h, "[]"))
		}
	}
	if nodes, ok := m["remote_multi_nodes_meta_mapping"].(map[string]any); ok {
		for _, n := range nodes {
			e := n.(map[string]any)
			out = append(out, net.JoinHostPort(strings.Trim(e["host"].(string), "[]"), string(e["handshake_port"].(json.Number))))
		}
	}
	if hs, ok := m["remote_hosts"].([]any); ok {
		for _, h := range hs {
			hosts = append(hosts, strings.Trim(h.(string), "[]"))
		}
	}
	var ports []string
	for _, k := range []string{"remote_port", "remote_handshake_port", "remote_notify_port", "peer_port"} {
		if n, ok := m[k].(json.Number); ok && n != "0" {
			ports = append(ports, string(n))
		}
	}
	if len(ports) == 0 {
		ports = []string{"0"}
	}
	for _, h := range hosts {
		for _, p := range ports {
			out = append(out, net.JoinHostPort(h, p))
		}
	}
	if a, ok := m["agent"].(string); ok {
		h, p, _ := net.SplitHostPort(a)
		out = append(out, net.JoinHostPort(h, p))
	}
	return out
}

func sameAddrs(t *testing.T, what string, got []connectors.Addr, named []string, answer []byte) {
	t.Helper()
	var g []string
	for _, a := range got {
		g = append(g, a.String())
	}
	slices.Sort(g)
	slices.Sort(named)
	if !slices.Equal(g, named) {
		t.Fatalf("%s: reported addresses %v, the params name %v (answer %q)", what, g, named, answer)
	}
}

const fuzzClient = `{"model":"m","prompt":"hello","max_tokens":5,"stream":true}`

func seedAnswers(f *testing.F) {
	nixl := `"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[1,2]],"remote_engine_id":"e","remote_request_id":"r","remote_host":"10.0.0.1","remote_port":5600,"tp_size":1`
	src := `{"agent":"10.0.0.1:5700","transport":"tcp","engine_id":"e","request_id":"r","block_ids":[4,5],"block_bytes":4096,"num_tokens":20,"checksums":[1,18446744073709551615],"lease_ms":30000}`
	for _, s := range []string{
		`{"choices":[{"text":"a","finish_reason":"length"}],"kv_transfer_params":{` + nixl + `}}`,
		`{"choices":[{"text":"a","finish_reason":"length"}],"kv_transfer_params":{` + nixl + `,"remote_bootstrap_addr":"http://10.9.9.9:1"}}`,
		`{"choices":[{"text":"a","finish_reason":"length"}],"kv_transfer_params":{` + nixl + `,"remote_host":"10.9.9.9"}}`,
		`{"choices":[{"text":"a","finish_reason":"length"}],"kv_transfer_params":{` + nixl + `,"dcp_size":1,"pp_size":2,"remote_num_tokens":40,"remote_blocks_expiry_time":null,"transfer_mode":"pull","kv_layout_v":3,"extra_flags":[1,true,"HND_X"],"nested":{"a":{"b":"1.2.3.4"}},"next_host":"prefill-1"}}`,
		`{"choices":[{"text":"a","finish_reason":"length"}],"kv_transfer_params":{"remote\u005fhost":"10.9.9.9",` + nixl + `}}`,
		`{"choices":[{"text":"a","finish_reason":"length"}],"kv_transfer_params":{` + nixl + `,"x":` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `}}`,
		`{"choices":[{"text":"a","finish_reason":"length"}],"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[],"remote_engine_id":"e","remote_host":"fd00::1","remote_port":0,"remote_hosts":["10.0.0.2","[fd00::2]"],"remote_notify_port":61005,"remote_handshake_port":6301,"transfer_id":"tx1","prefill_complete_ts":1.5}}`,
		`{"choices":[{"text":"a","finish_reason":"length"}],"kv_transfer_params":{"do_remote_prefill":true,"tp_size":2,"kv_source":` + src + `}}`,
		`{"choices":[{"text":"","finish_reason":"stop"}],"kv_transfer_params":null}`,
		`{"0":{"engine_id":"e0","kv_host":"10.0.0.1"},"1":{"engine_id":"e1"}}`,
		`{"id":"x","ec_transfer_params":{"abcd":{"peer_host":"10.0.0.3","peer_port":7000,"size_bytes":4096,"shape":[2,512],"metadata":{"image_grid_thw":[1,4,4]}},"ef":{"metadata":{}}}}`,
		`{"id":"x","ec_transfer_params":{"abcd":{"peer_host":"10.0.0.3","peer_port":7000,"size_bytes":4096,"nixl_agent_metadata_b64":"TklYTA=="}}}`,
		`{"choices":[{"text":"a","finish_reason":"length"}],"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[[1]],"remote_engine_id":"0","remote_request_id":"r","remote_host":"10.0.0.1","remote_port":30000,"remote_multi_nodes_meta_mapping":{"0":{"host":"10.0.0.2","engine_id":"0","handshake_port":30001}}}}`,
		`{"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"a","remote_host":"b"}}`, `{}`, `[]`, `nul`, `{"kv_transfer_params":`,
	} {
		f.Add([]byte(s), uint8(0))
	}
}

// FuzzPrefillAnswerHandoff feeds arbitrary upstream answers through every
// sequential connector's ParsePrefill and DecodeBody (and nixlv2's
// ReleaseBody, MoRI-IO's serial decode params, the sidecar connector's
// kv_source), Mooncake's bootstrap reading and its decode leg, and the
// encoder stage's ec_transfer_params: never a panic; what reaches an
// engine holds only the documented members with their documented types
// and sizes; the addresses the connector reports are exactly those it
// hands on.
func FuzzPrefillAnswerHandoff(f *testing.F) {
	seedAnswers(f)
	client := []byte(fuzzClient)
	f.Fuzz(func(t *testing.T, answer []byte, apiSel uint8) {
		api := apis[int(apiSel)%len(apis)]
		orig := append([]byte(nil), answer...)
		for _, c := range []struct {
			name    string
			conn    connectors.Sequential
			members memberCheck
		}{
			{"nixlv2", nixlv2.New(), nixlMembers},
			{"moriio", moriio.ReadHandoffs(nixlv2.New()), moriMembers},
		} {
			h, err := c.conn.ParsePrefill(api, answer)
			if err != nil || h.Done {
				continue
			}
			m := checkMembers(t, c.name+" handoff", h.Params, c.members, answer, h.Unknown...)
			sameAddrs(t, c.name, h.Addrs, namedAddrs(m), answer)
			params := h.Params
			if c.name == "moriio" {
				if params, err = moriio.SerialDecodeParams(h.Params, moriio.Ports{DecodeNotify: 61005, DecodeHandshake: 6301, TPSize: 1, DPSize: 2},
					moriio.Leg{Rank: moriio.DecodeRank(h.Params, 2, 0), TransferID: "tx1"}, nil); err != nil {
					t.Fatalf("moriio: serial decode params of a read handoff: %v", err)
				}
				checkMembers(t, "moriio decode params", params, moriMembers, answer, h.Unknown...)
			}
			dec, err := c.conn.DecodeBody(nil, api, client, connectors.Handoff{Params: params})
			if err != nil {
				t.Fatalf("%s: decode body: %v", c.name, err)
			}
			got := gjson.GetBytes(dec, "kv_transfer_params")
			checkMembers(t, c.name+" decode leg", []byte(got.Raw), c.members, answer, h.Unknown...)
			if !json.Valid(dec) {
				t.Fatalf("%s: decode leg not valid JSON: %q", c.name, dec)
			}
			if c.name == "nixlv2" {
				rel, err := nixlv2.New().ReleaseBody(nil, api, client, h)
				if err != nil || gjson.GetBytes(rel, "kv_transfer_params").Raw != string(h.Params) {
					t.Fatalf("release leg carries other params than the handoff: %q, %v", rel, err)
				}
			}
		}

		sc := sidecar.New()
		if h, err := sc.ParsePrefill(api, answer); err == nil && !h.Done {
			raw, err := sc.KVSource(h)
			if err != nil {
				t.Fatalf("sidecar: a read handoff has no kv_source: %v", err)
			}
			m := checkMembers(t, "kv_source", raw, sourceMembers, answer)
			sameAddrs(t, "sidecar", h.Addrs, namedAddrs(m), answer)
		}

		ss := sharedstorage.New()
		if h, err := ss.ParsePrefill(api, answer); err == nil {
			dec, err := ss.DecodeBody(nil, api, client, h)
			if err != nil || gjson.GetBytes(dec, "kv_transfer_params").Exists() || len(h.Addrs) > 0 {
				t.Fatalf("shared-storage hands on params: %q, %v", dec, err)
			}
		}

		mc := mooncake.New(8998)
		if b, err := mc.ParseBootstrap("10.0.0.1:8998", answer); err == nil {
			_, dec, err := mc.Legs(api, client, connectors.Pairing{PrefillHost: "10.0.0.1", TransferID: "xfer-1", Bootstrap: b})
			if err != nil || !json.Valid(dec) {
				t.Fatalf("mooncake: decode leg %q, %v (answer %q)", dec, err, answer)
			}
			m := checkMembers(t, "mooncake decode leg", []byte(gjson.GetBytes(dec, "kv_transfer_params").Raw), memberCheck{
				"do_remote_prefill": isBool, "do_remote_decode": isBool, "transfer_id": isID, "remote_engine_id": isID,
				"remote_bootstrap_addr": func(v any) bool { return v == "http://10.0.0.1:8998" },
			}, answer)
			if len(m) != 5 {
				t.Fatalf("mooncake: decode params %v", m)
			}
		}

		if ec, addrs, err := connectors.ECParamsOf(answer); err == nil && ec != nil {
			var named []string
			gjson.ParseBytes(ec).ForEach(func(k, e gjson.Result) bool {
				if !isID(k.Str) || k.Raw != strconv.Quote(k.Str) {
					t.Fatalf("ec_transfer_params: key %s handed on", k.Raw)
				}
				var unknown []string // an Open schema's: checked to name no address
				e.ForEach(func(k, _ gjson.Result) bool {
					if _, ok := ecMembers[k.Str]; !ok {
						unknown = append(unknown, k.Str)
					}
					return true
				})
				m := checkMembers(t, "ec entry", []byte(e.Raw), ecMembers, answer, unknown...)
				if _, ok := m["peer_host"]; ok {
					named = append(named, namedAddrs(m)...)
				}
				return true
			})
			sameAddrs(t, "ec", addrs, named, answer)
		}

		if !bytes.Equal(orig, answer) {
			t.Fatal("the answer was modified")
		}
	})
}
