package moriio_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/connectors/moriio"
	"github.com/pd-sidecar/pd-sidecar/connectors/nixlv2"
)

func TestReadHandoffsMoriIO(t *testing.T) {
	c := moriio.ReadHandoffs(nixlv2.New())
	answer := func(params string) []byte {
		return []byte(`{"choices":[{"text":"a","finish_reason":"length"}],"kv_transfer_params":` + params + `}`)
	}
	tests := []struct {
		name   string
		params string
		want   string
		addrs  []string
	}{
		{"engine-sim's serial answer", `{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":"e","remote_block_ids":[],"remote_host":"10.0.0.9","remote_port":0,"tp_size":1,"remote_dp_rank":3}`,
			`{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[],"remote_engine_id":"e","remote_host":"10.0.0.9","remote_port":0,"remote_dp_rank":3,"tp_size":1}`,
			[]string{"10.0.0.9:0"}},
		{"vLLM's, multi-node", `{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[4,5]],"remote_engine_id":"10.0.0.9:6301","remote_host":"10.0.0.9","remote_handshake_port":6301,"remote_notify_port":61005,"remote_dp_size":2,"tp_size":2,"transfer_id":"txr","remote_hosts":["10.0.0.9","10.0.0.10"],"prefill_complete_ts":1767225600.25}`,
			`{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[4,5]],"remote_engine_id":"10.0.0.9:6301","remote_host":"10.0.0.9","remote_handshake_port":6301,"remote_notify_port":61005,"remote_dp_size":2,"tp_size":2,"transfer_id":"txr","remote_hosts":["10.0.0.9","10.0.0.10"],"prefill_complete_ts":1.76722560025e+09}`,
			[]string{"10.0.0.9:6301", "10.0.0.9:61005", "10.0.0.9:6301", "10.0.0.9:61005", "10.0.0.10:6301", "10.0.0.10:61005"}},
		{"extra field", `{"do_remote_prefill":true,"remote_host":"10.0.0.9","kv_source":{}}`, "", nil},
		{"a remote_hosts entry that is no host", `{"do_remote_prefill":true,"remote_host":"10.0.0.9","remote_hosts":["10.0.0.9","a b"]}`, "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := c.ParsePrefill(connectors.APICompletions, answer(tt.params))
			if tt.want == "" {
				require.ErrorIs(t, err, connectors.ErrInvalidKVParams)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, string(h.Params))
			var got []string
			for _, a := range h.Addrs {
				got = append(got, a.String())
			}
			assert.Equal(t, tt.addrs, got)
		})
	}
}
