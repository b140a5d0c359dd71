package proxy

import (
	"bytes"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// TestNormalTarget: a target is served only when the path fasthttp routes
// on is the path as sent.
func TestNormalTarget(t *testing.T) {
	for _, tc := range []struct {
		target string
		ok     bool
	}{
		{"/v1/completions", true},
		{"/v1/completions?a=../b&c=%2e", true},
		{"/v1/models", true},
		{"/", true},
		{"*", true},
		{"http://engine.example/v1/completions?x=1", true},
		{"/v1/../v1/completions", false},
		{"/v1/%2e%2e/v1/completions", false},
		{"/v1/%2E%2E/v1/completions", false},
		{"/v1/%63ompletions", false},
		{"/v1%2Fcompletions", false},
		{"//v1/completions", false},
		{"/v1//completions", false},
		{"/v1/./completions", false},
		{"/v1/completions/.", false},
		{"/v1/completions/..", false},
		{"/v1/completions#top", false},
		{"/v1/%", false},
		{"/v1/%zz", false},
		{"/v1/completions?x#top", false},
		{"http://engine.example//v1/completions", false},
		{"http://engine.example/v1/../v1/completions", false},
	} {
		var u fasthttp.URI
		require.NoError(t, u.Parse([]byte("x"), []byte(tc.target)), tc.target)
		assert.Equal(t, tc.ok, normalTarget([]byte(tc.target), &u), "%s (fasthttp routes on %q)", tc.target, u.Path())
	}
}

// FuzzNormalTarget: whatever the target, one the sidecar serves is
// forwarded (as sent, or in origin form) on the path it was routed on.
func FuzzNormalTarget(f *testing.F) {
	for _, s := range []string{"/v1/completions", "/v1/../v1/completions", "http://h/v1/completions?x=1", "//v1/x",
		"/a%2Fb", "/v1/completions#x", "*", "h://x//y", "/x://y/../z"} {
		f.Add([]byte("x"), []byte(s))
	}
	f.Fuzz(func(t *testing.T, host, target []byte) {
		var u fasthttp.URI
		if u.Parse(host, target) != nil || !normalTarget(target, &u) || string(target) == "*" {
			return
		}
		fwd := target
		if o := originFormOf(target, &u); o != nil {
			fwd = o
		}
		path, _, _ := bytes.Cut(fwd, []byte("?"))
		got, err := url.PathUnescape(string(path))
		if err != nil || got != string(u.Path()) {
			t.Fatalf("target %q (host %q): routed on %q, forwarded %q", target, host, u.Path(), fwd)
		}
	})
}
