package prevresponse

import (
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/metrics"
	"github.com/pd-sidecar/pd-sidecar/proxy/feature"
)

// quiet logs nothing.
type quiet struct{}

func (quiet) LogAt(zerolog.Level) *zerolog.Event { return nil }

// TestGuardDeclines: only a /v1/responses request that names a prefiller
// and whose previous_response_id is a string is declined, with the
// previous_response reason.
func TestGuardDeclines(t *testing.T) {
	const p = "10.0.0.1:8000"
	for _, tc := range []struct {
		name      string
		api       connectors.API
		prefiller string
		body      string
		declined  bool
	}{
		{"previous response, prefiller named", connectors.APIResponses, p, `{"model":"m","input":"hi","previous_response_id":"resp_1"}`, true},
		{"previous response after a long input", connectors.APIResponses, p, `{"input":[{"role":"user","content":"a\"previous_response_id\":\"x\""}],"previous_response_id":"resp_1"}`, true},
		{"empty id is still an id", connectors.APIResponses, p, `{"input":"hi","previous_response_id":""}`, true},
		{"previous response, no prefiller", connectors.APIResponses, "", `{"input":"hi","previous_response_id":"resp_1"}`, false},
		{"no previous response", connectors.APIResponses, p, `{"model":"m","input":"hi"}`, false},
		{"null previous response", connectors.APIResponses, p, `{"input":"hi","previous_response_id":null}`, false},
		{"previous response of another type", connectors.APIResponses, p, `{"input":"hi","previous_response_id":7}`, false},
		{"nested, not top level", connectors.APIResponses, p, `{"input":"hi","metadata":{"previous_response_id":"resp_1"}}`, false},
		{"another API", connectors.APIChat, p, `{"messages":[],"previous_response_id":"resp_1"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := Guard{}.Begin(feature.Request{API: tc.api, Body: []byte(tc.body), Prefiller: tc.prefiller, Log: quiet{}}, nil)
			if !tc.declined {
				assert.Nil(t, u)
				return
			}
			d, ok := u.(feature.SplitDecliner)
			if assert.True(t, ok, "a decline") {
				assert.Equal(t, metrics.DeclinePreviousResponse, d.DeclinedSplit())
			}
		})
	}
}
