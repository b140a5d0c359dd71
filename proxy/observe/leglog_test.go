package observe_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/proxy/observe"
)

func TestLogsLegs(t *testing.T) {
	require.Equal(t, zerolog.TraceLevel, zerolog.GlobalLevel(), "the global level lets all through")
	for level, want := range map[zerolog.Level]bool{
		zerolog.TraceLevel: true, zerolog.DebugLevel: false, zerolog.InfoLevel: false, zerolog.Disabled: false,
	} {
		assert.Equal(t, want, observe.LogsLegs(level), level.String())
	}
}

func TestLogLeg(t *testing.T) {
	const limit = 64 << 10
	tests := []struct {
		name     string
		headers  map[string]string
		body     string
		redacted []string // headers whose value is not shown
		shown    map[string]string
		cut      bool
	}{
		{
			name: "credentials are redacted",
			headers: map[string]string{"Authorization": "Bearer sk-secret-1", "Proxy-Authorization": "Basic secret-2",
				"Cookie": "session=secret-3", "X-Api-Key": "secret-4", "X-Request-Id": "req-1"},
			body:     `{"prompt":"hi"}`,
			redacted: []string{"Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key"},
			shown:    map[string]string{"X-Request-Id": "req-1"},
		},
		{name: "a body up to the bound is whole", body: strings.Repeat("a", limit)},
		{name: "a longer body is cut", body: strings.Repeat("a", limit+1), cut: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			log := zerolog.New(&out).Level(zerolog.TraceLevel)
			req := fasthttp.AcquireRequest()
			defer fasthttp.ReleaseRequest(req)
			req.Header.SetMethod(fasthttp.MethodPost)
			req.SetRequestURI("/v1/completions")
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			req.SetBodyString(tc.body)
			observe.LogLeg(log.Trace(), "10.0.0.1:8000", req)

			var line struct {
				Message, Leg, Method, URI, Body string
				BodyBytes                       *int `json:"body_bytes"`
				Headers                         map[string]string
			}
			require.NoError(t, json.Unmarshal(out.Bytes(), &line), out.String())
			assert.Equal(t, "leg sent", line.Message)
			assert.Equal(t, "10.0.0.1:8000", line.Leg)
			assert.Equal(t, "POST", line.Method)
			assert.Equal(t, "/v1/completions", line.URI)
			for _, k := range tc.redacted {
				assert.Equal(t, "[redacted]", line.Headers[k], k)
				assert.NotContains(t, out.String(), tc.headers[k], k)
			}
			for k, v := range tc.shown {
				assert.Equal(t, v, line.Headers[k], k)
			}
			if tc.cut {
				require.NotNil(t, line.BodyBytes)
				assert.Equal(t, len(tc.body), *line.BodyBytes)
				assert.Equal(t, tc.body[:limit], line.Body)
			} else {
				assert.Nil(t, line.BodyBytes)
				assert.Equal(t, tc.body, line.Body)
			}
		})
	}
}

func TestLogLegWithoutEvent(t *testing.T) {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	assert.NotPanics(t, func() { observe.LogLeg(nil, "10.0.0.1:8000", req) })
}
