package shortprompt

import (
	"strings"
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

// TestGuardDeclines: only a request that names a prefiller and whose
// prompt the estimate reads as shorter than the limit is declined, with
// the short-prompt reason.
func TestGuardDeclines(t *testing.T) {
	short := `{"model":"m","prompt":"hi"}`
	long := `{"model":"m","prompt":"` + strings.Repeat("word ", 400) + `"}`
	for _, tc := range []struct {
		name      string
		prefiller string
		body      string
		declined  bool
	}{
		{"short, prefiller named", "10.0.0.1:8000", short, true},
		{"long, prefiller named", "10.0.0.1:8000", long, false},
		{"short, no prefiller", "", short, false},
		{"unreadable prompt", "10.0.0.1:8000", `{"model":"m","prompt":{"x":1}}`, false},
		{"no prompt", "10.0.0.1:8000", `{"model":"m"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := Guard{Limit: 64}.Begin(feature.Request{
				API: connectors.APICompletions, Body: []byte(tc.body), Prefiller: tc.prefiller, Log: quiet{},
			}, nil)
			if !tc.declined {
				assert.Nil(t, u)
				return
			}
			d, ok := u.(feature.SplitDecliner)
			if assert.True(t, ok, "a decline") {
				assert.Equal(t, metrics.DeclineShortPrompt, d.DeclinedSplit())
			}
		})
	}
}
