package connectors_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

func TestKVSourceBodies(t *testing.T) {
	src := connectors.P2PPeer{RequestID: "s", Host: "fd00::7", Port: 7778}
	const srcJSON = `{"kv_request_id":"s","remote_host":"fd00::7","remote_port":7778}`
	tests := []struct {
		name     string
		body     string
		with     string // WithKVSource
		only     string // OnlyKVSource
		wantFail bool
	}{
		{name: "nixlv2 prefill leg keeps its params",
			body: `{"prompt":"p","kv_transfer_params":{"do_remote_decode":true,"remote_host":null}}`,
			with: `{"prompt":"p","kv_transfer_params":{"do_remote_decode":true,"remote_host":null,"remote_kv_source":` + srcJSON + `}}`,
			only: `{"prompt":"p","kv_transfer_params":{"remote_kv_source":` + srcJSON + `}}`},
		{name: "no params",
			body: `{"prompt":"p"}`,
			with: `{"prompt":"p","kv_transfer_params":{"remote_kv_source":` + srcJSON + `}}`,
			only: `{"prompt":"p","kv_transfer_params":{"remote_kv_source":` + srcJSON + `}}`},
		{name: "params not an object",
			body: `{"prompt":"p","kv_transfer_params":null}`,
			with: `{"prompt":"p","kv_transfer_params":{"remote_kv_source":` + srcJSON + `}}`,
			only: `{"prompt":"p","kv_transfer_params":{"remote_kv_source":` + srcJSON + `}}`},
		{name: "not an object", body: `"x"`, wantFail: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			with, err := connectors.WithKVSource(nil, []byte(tt.body), src)
			only, err2 := connectors.OnlyKVSource(nil, []byte(tt.body), src)
			if tt.wantFail {
				assert.ErrorIs(t, err, connectors.ErrBadBody)
				assert.ErrorIs(t, err2, connectors.ErrBadBody)
				return
			}
			require.NoError(t, err)
			require.NoError(t, err2)
			assert.JSONEq(t, tt.with, string(with))
			assert.JSONEq(t, tt.only, string(only))
		})
	}
}
