package prefillstrip_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/pd-sidecar/pd-sidecar/proxy/prefillstrip"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		names []string
		err   string
	}{
		{nil, ""},
		{[]string{"Authorization", "Cookie", "X-Api-Key", "traceparent"}, ""},
		{[]string{"X Bad"}, "is not a header name"},
		{[]string{""}, "is not a header name"},
		{[]string{"host"}, "every leg needs it"},
		{[]string{"Content-Type"}, "every leg needs it"},
		{[]string{"X-REQUEST-ID"}, "every leg needs it"},
		{[]string{"content-length"}, "every leg needs it"},
	} {
		err := prefillstrip.Validate(tc.names)
		if tc.err == "" {
			assert.NoError(t, err, "%q", tc.names)
			continue
		}
		require.Error(t, err, "%q", tc.names)
		assert.Contains(t, err.Error(), tc.err)
	}
}

// TestStripped: a header is stripped when named, in any letter case.
func TestStripped(t *testing.T) {
	strip := prefillstrip.Names([]string{"Authorization", "X-API-Key"})
	assert.Equal(t, []string{"authorization", "x-api-key"}, strip)
	for _, tc := range []struct {
		k    string
		want bool
	}{
		{"authorization", true},
		{"AUTHORIZATION", true},
		{"x-Api-key", true},
		{"x-api-keys", false},
		{"cookie", false},
		{"", false},
	} {
		assert.Equal(t, tc.want, prefillstrip.Stripped([]byte(tc.k), strip), "%q", tc.k)
	}
	assert.False(t, prefillstrip.Stripped([]byte("authorization"), nil), "nothing named")
}

// TestStrip: every copy of a named header goes, in any letter case, the
// rest stays (h normalizes its keys, as a leg's head does).
func TestStrip(t *testing.T) {
	var h fasthttp.RequestHeader
	h.Add("Authorization", "a")
	h.Add("authorization", "b")
	h.Add("X-Custom", "kept")
	prefillstrip.Strip(&h, prefillstrip.Names([]string{"AUTHORIZATION"}))
	assert.Empty(t, h.Peek("Authorization"))
	assert.Empty(t, h.Peek("authorization"))
	assert.Equal(t, "kept", string(h.Peek("X-Custom")))
}
