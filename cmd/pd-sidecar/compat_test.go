package main

import (
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestModelserviceArgs parses exactly the arguments llm-d's modelservice
// chart gives its routing-proxy container, so the image swap of
// deploy/helm/llm-d-modelservice-values.yaml starts.
func TestModelserviceArgs(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		connector string
	}{
		{"modelservice defaults", []string{"--port=8000", "--vllm-port=8200", "--connector=nixlv2", "-v=5"}, "nixlv2"},
		{"kv-connector wins when last", []string{"--connector=nixlv2", "--kv-connector=nixlv2"}, "nixlv2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args, io.Discard)
			require.NoError(t, err)
			assert.Equal(t, tc.connector, o.connector)
			assert.Equal(t, 8200, o.cfg.ModelServerPort)
		})
	}
}
