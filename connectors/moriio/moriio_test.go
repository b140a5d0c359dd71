package moriio

import (
	"encoding/json"
	"reflect"
	"testing"
)

// TestPickRankReferenceValues pins the rank choice to llm-d's
// (TestPickDPRankReferenceValues: "abc" with 8 ranks is rank 2); the other
// values were checked against Python's hashlib.blake2s.
func TestPickRankReferenceValues(t *testing.T) {
	for _, c := range []struct {
		id   string
		size int
		want int
	}{
		{"abc", 8, 2}, {"abc", 1, 0}, {"abc", 0, 0}, {"", 8, 4},
		{"req-1", 16, 5}, {"tx", 16, 11}, {"0123456789abcdef0123456789abcdef", 16, 14},
	} {
		if got := PickRank(c.id, c.size); got != c.want {
			t.Errorf("PickRank(%q, %d) = %d, want %d", c.id, c.size, got, c.want)
		}
	}
}

func decode(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return m
}

var ports = Ports{DecodeNotify: 61005, DecodeHandshake: 6301, PrefillNotify: 61006, PrefillHandshake: 6302, TPSize: 1, DPSize: 16, DPSizeLocal: 8}

func TestLegParams(t *testing.T) {
	l := Leg{Rank: 5, TransferID: TransferID("req-1")}
	for _, c := range []struct {
		name string
		got  []byte
		want map[string]any
	}{
		{"prefill 1P1D", PrefillParams(Ports{DecodeNotify: 61005, DecodeHandshake: 6301, TPSize: 2, DPSize: 8}, "10.0.0.2", l, nil), map[string]any{
			"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil, "remote_block_ids": nil,
			"remote_host": "10.0.0.2", "remote_port": nil, "remote_notify_port": 61005.0, "remote_dp_rank": 5.0,
			"remote_dp_rank_override": true, "remote_handshake_port": 6301.0, "transfer_id": "txreq-1", "tp_size": 2.0, "remote_dp_size": 8.0,
		}},
		{"prefill 2P2D", PrefillParams(ports, "10.0.0.2", l, []string{"10.0.1.1", "10.0.1.2"}), map[string]any{
			"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil, "remote_block_ids": nil,
			"remote_host": "10.0.0.2", "remote_port": nil, "remote_notify_port": 61005.0, "remote_dp_rank": 5.0,
			"remote_dp_rank_override": true, "remote_handshake_port": 6301.0, "transfer_id": "txreq-1", "tp_size": 1.0, "remote_dp_size": 16.0,
			"remote_hosts": []any{"10.0.1.1", "10.0.1.2"}, "remote_dp_size_local": 8.0,
		}},
		{"parallel decode 2P2D", ParallelDecodeParams(ports, "10.0.2.1", l, []string{"10.0.2.1", "10.0.2.2"}), map[string]any{
			"do_remote_prefill": true, "do_remote_decode": false, "remote_engine_id": "10.0.2.1:6302", "remote_block_ids": []any{},
			"remote_host": "10.0.2.1", "remote_port": 6302.0, "remote_notify_port": 61006.0, "remote_dp_rank": 5.0,
			"remote_dp_rank_override": true, "remote_handshake_port": 6302.0, "transfer_id": "txreq-1", "tp_size": 1.0, "remote_dp_size": 16.0,
			"remote_hosts": []any{"10.0.2.1", "10.0.2.2"}, "remote_dp_size_local": 8.0,
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := decode(t, c.got); !reflect.DeepEqual(got, c.want) {
				t.Errorf("got  %v\nwant %v", got, c.want)
			}
		})
	}
}

func TestDecodeRank(t *testing.T) {
	for _, c := range []struct {
		params string
		want   int
	}{
		{`{"remote_dp_rank":3}`, 3}, {`{"remote_dp_rank":0}`, 0}, {`{"remote_dp_rank":8}`, 7},
		{`{"remote_dp_rank":-1}`, 7}, {`{"remote_dp_rank":2.5}`, 7}, {`{"remote_dp_rank":"3"}`, 7}, {`{}`, 7},
	} {
		if got := DecodeRank([]byte(c.params), 8, 7); got != c.want {
			t.Errorf("DecodeRank(%s) = %d, want %d", c.params, got, c.want)
		}
	}
}

func TestSerialDecodeParams(t *testing.T) {
	l := Leg{Rank: 3, TransferID: "txr"}
	for _, c := range []struct {
		name, returned string
		hosts          []string
		want           map[string]any
	}{
		{"backfills what is absent", `{"do_remote_prefill":true,"remote_host":"p"}`, nil, map[string]any{
			"do_remote_prefill": true, "remote_host": "p", "remote_dp_rank": 3.0, "remote_dp_rank_override": true,
			"transfer_id": "txr", "remote_notify_port": 61005.0, "remote_handshake_port": 6301.0, "remote_dp_size": 16.0,
		}},
		{"keeps what is there", `{"transfer_id":"other","remote_notify_port":1,"remote_handshake_port":2,"remote_dp_size":4,"remote_dp_rank":1,"remote_dp_rank_override":false,"remote_hosts":["x"]}`, []string{"a", "b"}, map[string]any{
			"transfer_id": "other", "remote_notify_port": 1.0, "remote_handshake_port": 2.0, "remote_dp_size": 4.0,
			"remote_dp_rank": 3.0, "remote_dp_rank_override": true, "remote_hosts": []any{"x"}, "remote_dp_size_local": 8.0,
		}},
		{"wide-EP hosts", `{}`, []string{"a", "b"}, map[string]any{
			"remote_dp_rank": 3.0, "remote_dp_rank_override": true, "transfer_id": "txr", "remote_notify_port": 61005.0,
			"remote_handshake_port": 6301.0, "remote_dp_size": 16.0, "remote_hosts": []any{"a", "b"}, "remote_dp_size_local": 8.0,
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := SerialDecodeParams([]byte(c.returned), ports, l, c.hosts)
			if err != nil {
				t.Fatal(err)
			}
			if got := decode(t, b); !reflect.DeepEqual(got, c.want) {
				t.Errorf("got  %v\nwant %v", got, c.want)
			}
		})
	}
	if _, err := SerialDecodeParams([]byte(`null`), ports, l, nil); err == nil {
		t.Error("null params accepted")
	}
}

func TestParallelPrefillBody(t *testing.T) {
	b, err := ParallelPrefillBody([]byte(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":50,"min_tokens":5,"kv_transfer_params":{"x":1}}`), []byte(`{"y":2}`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"model": "m", "stream": false, "max_tokens": 1.0, "max_completion_tokens": 1.0,
		"max_output_tokens": 1.0, "min_tokens": 1.0, "kv_transfer_params": map[string]any{"y": 2.0}}
	if got := decode(t, b); !reflect.DeepEqual(got, want) {
		t.Errorf("got  %v\nwant %v", got, want)
	}
}
