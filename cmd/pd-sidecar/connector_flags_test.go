package main

import (
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
)

func TestConnectorFlags(t *testing.T) {
	tests := []struct {
		name         string
		env          string
		args         []string
		wantSG       int
		wantMC       int
		wantParseErr bool
		wantValidErr bool
	}{
		{"defaults", "", nil, 8998, 8998, false, false},
		{"env sets the sglang default", "9100", nil, 9100, 8998, false, false},
		{"flags win over env", "9100", []string{"--sglang-bootstrap-port", "9200", "--mooncake-bootstrap-port", "9300"}, 9200, 9300, false, false},
		{"bad env", "nope", nil, 0, 0, true, false},
		{"bad port", "", []string{"--mooncake-bootstrap-port", "70000"}, 8998, 70000, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
			var o connectorOptions
			err := addConnectorFlags(fs, &o, func(k string) string {
				if k == "SGLANG_BOOTSTRAP_PORT" {
					return tt.env
				}
				return ""
			})
			if tt.wantParseErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.NoError(t, fs.Parse(tt.args))
			assert.Equal(t, tt.wantSG, o.sglangBootstrapPort)
			assert.Equal(t, tt.wantMC, o.mooncakeBootstrapPort)
			assert.Equal(t, tt.wantValidErr, o.validate() != nil)
		})
	}
}

func TestConnectorRegistry(t *testing.T) {
	o := connectorOptions{sglangBootstrapPort: 1, mooncakeBootstrapPort: 2}
	for name, want := range map[string]connectors.Choreography{
		"nixlv2":         connectors.ChoreographySequential,
		"sglang":         connectors.ChoreographyConcurrent,
		"mooncake":       connectors.ChoreographyConcurrent,
		"shared-storage": connectors.ChoreographyDecodeFirst,
	} {
		c, err := connector(name, o)
		require.NoError(t, err, name)
		assert.Equal(t, name, c.Name())
		assert.Equal(t, want, connectors.ChoreographyOf(c), name)
	}
	_, err := connector("bogus", o)
	assert.ErrorContains(t, err, "sglang")
}
