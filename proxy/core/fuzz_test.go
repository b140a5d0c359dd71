package core

import (
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/tidwall/sjson"

	"github.com/pd-sidecar/pd-sidecar/proxy/sse"
	"github.com/pd-sidecar/pd-sidecar/ssrf"
)

// FuzzPickPrefiller: the header parser never panics, returns either a
// valid host:port or ErrBadPrefiller, and the allowlists agree with it.
func FuzzPickPrefiller(f *testing.F) {
	for _, s := range []string{"10.0.0.1:8000", " 10.0.0.1:8000 , 10.0.0.2:8000", "[::1]:80", "host", ":80", "a:0", "a:99999",
		",,", "[fe80::1%eth0]:1", "10.0.0.1:8000,", strings.Repeat("a", 300) + ":1"} {
		f.Add([]byte(s), false)
	}
	static, err := ssrf.ParseStatic([]string{"10.0.0.0/8", "*.svc:8000"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, v []byte, sampling bool) {
		hp, err := pickPrefiller(v, sampling)
		allowed := static.Allowed(hp)
		if err != nil {
			if !errors.Is(err, ErrBadPrefiller) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		host, _, serr := net.SplitHostPort(hp)
		if serr != nil || host == "" {
			t.Fatalf("accepted %q", hp)
		}
		if allowed && !strings.HasPrefix(hp, "10.") && !strings.Contains(hp, ".svc:") && !strings.HasPrefix(hp, "[::ffff:") {
			t.Fatalf("allowlist admitted %q", hp)
		}
	})
}

// FuzzSSEErrorEvent: the error event that ends a broken stream is valid
// JSON whatever the error text.
func FuzzSSEErrorEvent(f *testing.F) {
	f.Add("stream broke off", 502)
	f.Add("\"quoted\" \x00 \u2028 \xff", 500)
	f.Fuzz(func(t *testing.T, msg string, status int) {
		ev := sse.ErrorEvent(ErrorBody(status, errors.New(msg)))
		d := sse.FirstData(ev)
		if !json.Valid(d) {
			t.Fatalf("invalid error event %q", ev)
		}
		if b, _ := sjson.SetBytes(nil, "x", 1); len(b) == 0 {
			t.Fatal("sjson")
		}
	})
}
