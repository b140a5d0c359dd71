package core

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/failure"
	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
	"github.com/pd-sidecar/pd-sidecar/proxy/bootstrap"
	"github.com/pd-sidecar/pd-sidecar/proxy/dprank"
	"github.com/pd-sidecar/pd-sidecar/proxy/encoder"
	"github.com/pd-sidecar/pd-sidecar/proxy/guard"
	"github.com/pd-sidecar/pd-sidecar/proxy/kvpull"
	"github.com/pd-sidecar/pd-sidecar/proxy/split"
	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
	"github.com/pd-sidecar/pd-sidecar/proxy/upstream"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		err    error
		status int
		reason string
		retry  bool
	}{
		{ErrClientGone, 499, "", false},
		{fmt.Errorf("%w: x", ErrPrefillUnreachable), 502, failure.ReasonUnreachable, true},
		{fmt.Errorf("%w: x", split.ErrPrefillTimeout), 504, failure.ReasonTimeout, false},
		{ErrPrefillOverloaded, 429, failure.ReasonOverloaded, true},
		{fmt.Errorf("%w: status 503", ErrPrefillServerError), 502, failure.ReasonServerError, true},
		{&Rejected{Status: 404}, 400, "", false},
		{connectors.ErrNoKVParams, 502, failure.ReasonNoKVParams, false},
		{connectors.ErrInvalidKVParams, 502, failure.ReasonInvalidParams, false},
		{connectors.ErrBadPrefillAnswer, 502, failure.ReasonBadAnswer, false},
		{split.ErrTPMismatch, 502, failure.ReasonTPMismatch, false},
		{ErrBadPrefiller, 400, failure.ReasonBadPrefiller, false},
		{ErrKVLoadFailed, 500, failure.ReasonKVLoadFailed, false},
		{ErrEOSStream, 502, failure.ReasonEOSUnsupported, false},
		{fmt.Errorf("%w (30s)", split.ErrKVWaitTimeout), 504, failure.ReasonKVWaitTimeout, false},
		{fmt.Errorf("%w: an answer", upstream.ErrBufferBudget), 503, failure.ReasonBufferBudget, false},
		{fmt.Errorf("%w: %w", ErrDecodeFailed, upstream.ErrBufferBudget), 503, failure.ReasonBufferBudget, false},
		{fmt.Errorf("%w: refused", ErrDecodeUnavailable), 503, "", false},
		{fmt.Errorf("%w: reset", ErrDecodeFailed), 502, "", false},
		{fmt.Errorf("%w: %w", ErrBadRequest, connectors.ErrBadBody), 400, "", false},
		{fmt.Errorf("%w: \"a:1\"", dprank.ErrUnknown), 400, "", false},
		// An error carries the outcome of the outermost error in it that
		// has one, unless one of higher precedence stands anywhere in it.
		{fmt.Errorf("%w after 2s (after %w)", split.ErrPrefillTimeout, fmt.Errorf("%w: status 503", ErrPrefillServerError)), 504, failure.ReasonTimeout, false},
		{fmt.Errorf("%w for item 0: %w", encoder.ErrFailed, fmt.Errorf("%w: %w", ErrBadRequest, connectors.ErrBadBody)), 400, "", false},
		{fmt.Errorf("%w for item 0: reset", encoder.ErrFailed), 502, "", false},
		{fmt.Errorf("%w: sidecar pull: %w", ErrKVLoadFailed, &upstream.UpstreamError{Role: upstream.RoleKVAgent, Err: fmt.Errorf("%w: %w", kvpull.ErrAlloc, upstream.ErrBufferBudget)}), 503, failure.ReasonBufferBudget, false},
		{fmt.Errorf("%w: %w", split.ErrPrefillTimeout, ErrClientGone), 499, "", false},
		{fmt.Errorf("%w (%w)", ErrPrefillUnreachable, fmt.Errorf("%w: x", guard.ErrCircuitOpen)), 503, failure.ReasonCircuitOpen, false},
		{fmt.Errorf("%w: %w", guard.ErrCircuitOpen, fmt.Errorf("%w: x", guard.ErrPrefillerDenied)), 403, "", false},
		{fmt.Errorf("%w: %w after 1s", ErrDecodeTimeout, upstream.ErrFirstByteTimeout), 504, "", false},
		{fmt.Errorf("%w: %w", bootstrap.ErrFailed, connectors.ErrBadBootstrap), 502, failure.ReasonBootstrapFailed, false},
		{fmt.Errorf("%w: kv_source: %w", connectors.ErrInvalidKVParams, kvtransfer.ErrKVSourceGone), 502, failure.ReasonInvalidParams, false},
		{errors.New("no outcome"), 502, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.err.Error(), func(t *testing.T) {
			o := failure.Of(tt.err)
			assert.Equal(t, tt.status, o.Status)
			assert.Equal(t, tt.reason, o.Reason)
			assert.Equal(t, tt.retry, o.Retry)
		})
	}
}

func TestConfigValidate(t *testing.T) {
	require.NoError(t, DefaultConfig().Validate())
	tests := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"port", func(c *Config) { c.Port = 0 }, "--port"},
		{"dp range", func(c *Config) { c.Port, c.DataParallelSize = 65535, 2 }, "--port"},
		{"dp size", func(c *Config) { c.DataParallelSize = 0 }, "--data-parallel-size"},
		{"engine port", func(c *Config) { c.ModelServerPort = 70000 }, "--model-server-port"},
		{"metrics collides", func(c *Config) { c.MetricsPort = c.Port }, "--metrics-port"},
		{"retries", func(c *Config) { c.PrefillMaxRetries = -1 }, "--prefill-max-retries"},
		{"timeout", func(c *Config) { c.PrefillTimeout = 0 }, "--prefill-timeout"},
		{"connect", func(c *Config) { c.ConnectTimeout = -time.Second }, "--connect-timeout"},
		{"policy", func(c *Config) { c.OnKVLoadFailure = "retry" }, "--on-kv-load-failure"},
		{"tp", func(c *Config) { c.DecodeTPSize = -1 }, "--decode-tp-size"},
		{"short prompt", func(c *Config) { c.MinRemotePrefillTokens = -1 }, "--min-remote-prefill-tokens"},
		{"body", func(c *Config) { c.MaxRequestBodyBytes = 0 }, "--max-request-body-bytes"},
		{"sse event", func(c *Config) { c.MaxSSEEventBytes = MinMaxSSEEventBytes - 1 }, "--max-sse-event-bytes"},
		{"grace", func(c *Config) { c.ShutdownGrace = -1 }, "--shutdown-grace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.mod(&c)
			err := c.Validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			assert.NotContains(t, err.Error(), "\n")
		})
	}
}

func TestPickPrefiller(t *testing.T) {
	tests := []struct {
		in, want string
		err      bool
	}{
		{"10.0.0.1:8000", "10.0.0.1:8000", false},
		{" a:1 , b:2", "a:1", false},
		{"[::1]:9", "[::1]:9", false},
		{"nohost", "nohost", true},
		{":80", ":80", true},
		{"h:0", "h:0", true},
		{"h:99999", "h:99999", true},
	}
	for _, tt := range tests {
		got, err := pickPrefiller([]byte(tt.in), false)
		assert.Equal(t, tt.want, got, tt.in)
		assert.Equal(t, tt.err, errors.Is(err, ErrBadPrefiller), tt.in)
	}
	seen := map[string]bool{}
	for range 200 {
		got, err := pickPrefiller([]byte("a:1,b:2,c:3"), true)
		require.NoError(t, err)
		seen[got] = true
	}
	assert.Len(t, seen, 3, "sampling reaches every entry")
}

func TestRequestID(t *testing.T) {
	assert.Equal(t, "abc-123_x.y:z", RequestID([]byte("abc-123_x.y:z")))
	for _, bad := range []string{"", "has space", "a,b", strings.Repeat("x", 129), "new\nline"} {
		id := RequestID([]byte(bad))
		assert.Len(t, id, 32, bad)
		assert.NotEqual(t, bad, id)
	}
	assert.NotEqual(t, RequestID(nil), RequestID(nil))
}

func TestErrorBody(t *testing.T) {
	b := ErrorBody(http.StatusServiceUnavailable, fmt.Errorf("%w: \"quoted\"", ErrDecodeUnavailable))
	assert.JSONEq(t, `{"error":{"message":"decode engine unavailable: \"quoted\"","type":"ServiceUnavailableError","param":null,"code":503}}`, string(b))
	assert.Contains(t, string(sse.ErrorEvent(ErrorBody(502, ErrDecodeFailed))), "data: [DONE]\n\n")
}
