package passpolicy_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd-sidecar/pd-sidecar/connectors"
	"github.com/pd-sidecar/pd-sidecar/proxy/passpolicy"
)

func TestPolicyDecide(t *testing.T) {
	serving := passpolicy.DefaultConfig()
	none := passpolicy.Config{Policy: passpolicy.None}
	more := passpolicy.Config{Policy: passpolicy.Serving, AllowPaths: []string{"/sleep", "/v1/lora/*"}, AllowMethods: []string{"OPTIONS"}}
	all := passpolicy.Config{Policy: passpolicy.All}
	for _, tc := range []struct {
		name         string
		cfg          passpolicy.Config
		method, path string
		status       int
		allow        string
	}{
		{"models", serving, "GET", "/v1/models", 0, ""},
		{"models HEAD", serving, "HEAD", "/v1/models", 0, ""},
		{"models POST", serving, "POST", "/v1/models", 405, "GET, HEAD"},
		{"models DELETE", serving, "DELETE", "/v1/models", 405, "GET, HEAD"},
		{"tokenize", serving, "POST", "/tokenize", 0, ""},
		{"tokenize GET", serving, "GET", "/tokenize", 405, "POST"},
		{"embeddings", serving, "POST", "/v1/embeddings", 0, ""},
		{"engine metrics", serving, "GET", "/metrics", 0, ""},
		{"sglang generate", serving, "POST", "/generate", 0, ""},
		{"stored response", serving, "GET", "/v1/responses/resp_1", 0, ""},
		{"response cancel", serving, "POST", "/v1/responses/resp_1/cancel", 0, ""},
		{"responses prefix is not the path", serving, "GET", "/v1/responses", 405, "POST"},
		{"inference GET", serving, "GET", "/v1/chat/completions", 405, "POST"},
		{"render is no inference", serving, "POST", "/v1/chat/completions/render", 0, ""},
		// The engines' admin endpoints.
		{"sleep", serving, "POST", "/sleep", 403, ""},
		{"wake_up", serving, "POST", "/wake_up", 403, ""},
		{"is_sleeping", serving, "GET", "/is_sleeping", 403, ""},
		{"collective_rpc", serving, "POST", "/collective_rpc", 403, ""},
		{"reset_prefix_cache", serving, "POST", "/reset_prefix_cache", 403, ""},
		{"start_profile", serving, "POST", "/start_profile", 403, ""},
		{"load_lora_adapter", serving, "POST", "/v1/load_lora_adapter", 403, ""},
		{"scale_elastic_ep", serving, "POST", "/scale_elastic_ep", 403, ""},
		{"pause", serving, "POST", "/pause", 403, ""},
		{"server_info", serving, "GET", "/server_info", 403, ""},
		{"openapi", serving, "GET", "/openapi.json", 403, ""},
		{"sglang flush_cache", serving, "POST", "/flush_cache", 403, ""},
		{"debug/pd is not the engine's", serving, "GET", "/debug/pd", 403, ""},
		// Methods no path passes: refused whatever the path.
		{"TRACE", serving, "TRACE", "/v1/models", 405, "GET, HEAD"},
		{"TRACE unknown path", serving, "TRACE", "/", 405, ""},
		{"CONNECT", serving, "CONNECT", "/evil.example:443", 405, ""},
		{"OPTIONS *", serving, "OPTIONS", "/*", 405, ""},
		{"lower-case get is no GET", serving, "get", "/v1/models", 405, "GET, HEAD"},
		{"DELETE unknown path", serving, "DELETE", "/x", 405, ""},
		// Exact matches only: no trailing slash, no NUL, no case folding.
		{"trailing slash", serving, "GET", "/v1/models/", 403, ""},
		{"NUL", serving, "GET", "/v1/models\x00x", 403, ""},
		{"case", serving, "GET", "/V1/MODELS", 403, ""},
		{"root", serving, "GET", "/", 403, ""},
		// none: only the inference paths and the added ones.
		{"none models", none, "GET", "/v1/models", 403, ""},
		{"none inference GET", none, "GET", "/v1/completions", 405, "POST"},
		{"none TRACE", none, "TRACE", "/v1/models", 405, ""},
		// Added paths and methods.
		{"added path POST", more, "POST", "/sleep", 0, ""},
		{"added path GET", more, "GET", "/sleep", 0, ""},
		{"added path PUT", more, "PUT", "/sleep", 405, "GET, POST, HEAD, OPTIONS"},
		{"added prefix", more, "POST", "/v1/lora/a/b", 0, ""},
		{"added prefix is not the bare path", more, "POST", "/v1/lora", 403, ""},
		{"added method on a default path", more, "OPTIONS", "/v1/chat/completions", 0, ""},
		{"added method on a refused path", more, "OPTIONS", "/collective_rpc", 403, ""},
		{"others stay refused", more, "POST", "/wake_up", 403, ""},
		// all: everything, as llm-d.
		{"all TRACE", all, "TRACE", "/", 0, ""},
		{"all CONNECT", all, "CONNECT", "/evil.example:443", 0, ""},
		{"all sleep", all, "POST", "/sleep", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pp, err := passpolicy.New(tc.cfg)
			require.NoError(t, err)
			v := pp.Decide(tc.method, tc.path)
			assert.Equal(t, tc.status, v.Status)
			assert.Equal(t, tc.allow, v.Allow)
			switch tc.status {
			case 0:
				assert.True(t, v.Pass())
				assert.NoError(t, v.Err)
			case 405:
				assert.ErrorIs(t, v.Err, passpolicy.ErrMethod)
			case 403:
				assert.ErrorIs(t, v.Err, passpolicy.ErrPath)
			}
		})
	}
}

// TestPolicyAdmitsWhatTheLaneServes: the lane serves POSTs to the
// inference paths without asking the policy; every policy passes them, so
// the lane and fasthttp's path cannot disagree.
func TestPolicyAdmitsWhatTheLaneServes(t *testing.T) {
	for _, policy := range []string{passpolicy.Serving, passpolicy.None, passpolicy.All} {
		pp, err := passpolicy.New(passpolicy.Config{Policy: policy})
		require.NoError(t, err)
		n := 0
		for api := connectors.APICompletions; api <= connectors.APIGenerate; api++ {
			_, ok := connectors.APIForPath(api.String())
			require.True(t, ok, api.String())
			assert.True(t, pp.Decide("POST", api.String()).Pass(), "%s: POST %s", policy, api)
			n++
		}
		assert.Equal(t, 5, n, "every inference API")
	}
}

func TestPolicyOwnEndpoints(t *testing.T) {
	for _, tc := range []struct {
		policy, method string
		status         int
	}{
		{passpolicy.Serving, "GET", 0}, {passpolicy.Serving, "HEAD", 0}, {passpolicy.Serving, "POST", 405},
		{passpolicy.Serving, "TRACE", 405}, {passpolicy.None, "DELETE", 405}, {passpolicy.All, "TRACE", 0},
	} {
		pp, err := passpolicy.New(passpolicy.Config{Policy: tc.policy})
		require.NoError(t, err)
		v := pp.Own(tc.method)
		assert.Equal(t, tc.status, v.Status, "%s %s", tc.policy, tc.method)
		if tc.status != 0 {
			assert.Equal(t, "GET, HEAD", v.Allow)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  passpolicy.Config
		err  string
	}{
		{"default", passpolicy.DefaultConfig(), ""},
		{"none", passpolicy.Config{Policy: passpolicy.None, AllowPaths: []string{"/v1/models"}}, ""},
		{"everything under a prefix", passpolicy.Config{Policy: passpolicy.None, AllowPaths: []string{"/*"}}, ""},
		{"unknown policy", passpolicy.Config{Policy: "open"}, `--passthrough-policy must be serving, none or all, got "open"`},
		{"empty policy", passpolicy.Config{}, `--passthrough-policy must be serving, none or all, got ""`},
		{"all with paths", passpolicy.Config{Policy: passpolicy.All, AllowPaths: []string{"/x"}}, "--passthrough-allow-paths has no effect with --passthrough-policy all"},
		{"all with methods", passpolicy.Config{Policy: passpolicy.All, AllowMethods: []string{"PUT"}}, "--passthrough-allow-methods has no effect with --passthrough-policy all"},
		{"relative", passpolicy.Config{Policy: passpolicy.Serving, AllowPaths: []string{"sleep"}}, `--passthrough-allow-paths "sleep": a path pattern begins with /`},
		{"query", passpolicy.Config{Policy: passpolicy.Serving, AllowPaths: []string{"/x?a=1"}}, "no query"},
		{"inner star", passpolicy.Config{Policy: passpolicy.Serving, AllowPaths: []string{"/v1/*/x"}}, `"*" only ends a pattern`},
		{"star without slash", passpolicy.Config{Policy: passpolicy.Serving, AllowPaths: []string{"/v1*"}}, `"*" only ends a pattern`},
		{"space", passpolicy.Config{Policy: passpolicy.Serving, AllowPaths: []string{"/a b"}}, "visible ASCII"},
		{"method not a token", passpolicy.Config{Policy: passpolicy.Serving, AllowMethods: []string{"GET /"}}, "is not an HTTP method"},
		{"empty method", passpolicy.Config{Policy: passpolicy.Serving, AllowMethods: []string{""}}, "is not an HTTP method"},
		{"CONNECT", passpolicy.Config{Policy: passpolicy.Serving, AllowMethods: []string{"CONNECT"}}, "a CONNECT names a host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.err == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.err)
		})
	}
}
