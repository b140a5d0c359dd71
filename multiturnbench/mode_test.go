package multiturnbench

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"
)

func TestParseMode(t *testing.T) {
	def := 480 * time.Second
	for _, tc := range []struct {
		in, name, token string
		ttl             time.Duration
		err             string
	}{
		{in: "without", name: "without"},
		{in: "with", name: "with-conversation", token: TokenConversation, ttl: def},
		{in: "with-conversation", name: "with-conversation", token: TokenConversation, ttl: def},
		{in: "with-pod", name: "with-pod", token: TokenPod, ttl: def},
		{in: "with-none", name: "with-none", token: TokenNone, ttl: def},
		{in: "with-conversation@15s", name: "with-conversation@15s", token: TokenConversation, ttl: 15 * time.Second},
		{in: "with-pod@1m", name: "with-pod@1m0s", token: TokenPod, ttl: time.Minute},
		{in: "with-user", err: "session-token mode"},
		{in: "with-pod@0s", err: "positive duration"},
		{in: "with-pod@soon", err: "positive duration"},
		{in: "both", err: "neither without nor"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			m, err := parseMode(tc.in, def)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.name != tc.name || m.token != tc.token || m.ttl != tc.ttl {
				t.Errorf("got %+v, want name %q token %q ttl %v", m, tc.name, tc.token, tc.ttl)
			}
		})
	}
}

func TestOptionsModes(t *testing.T) {
	o := DefaultOptions()
	if err := o.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	o.Modes = []string{"without", "with", "with-conversation"}
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("with and with-conversation are one mode: %v", err)
	}
}

// The pod mode sends what llm-d's endpoint picker writes: base64
// (standard, padded) of namespace/name, one value for every conversation.
func TestPodSessionToken(t *testing.T) {
	got := PodSessionToken("llm-d/decode-0")
	if got != "bGxtLWQvZGVjb2RlLTA=" {
		t.Errorf("got %q", got)
	}
	if b, err := base64.StdEncoding.DecodeString(got); err != nil || string(b) != "llm-d/decode-0" {
		t.Errorf("decodes to %q, %v", b, err)
	}
	m := mode{token: TokenPod}
	a, b := m.sessionHeaders("x-session-token", "conv-1", got), m.sessionHeaders("x-session-token", "conv-2", got)
	if a["x-session-token"] != got || b["x-session-token"] != got {
		t.Errorf("pod mode headers %v and %v", a, b)
	}
}

func TestSessionHeaders(t *testing.T) {
	for _, tc := range []struct {
		token string
		want  map[string]string
	}{
		{"", map[string]string{"h": "conv-1"}},
		{TokenConversation, map[string]string{"h": "conv-1"}},
		{TokenPod, map[string]string{"h": "POD"}},
		{TokenNone, map[string]string{}},
	} {
		t.Run("token "+tc.token, func(t *testing.T) {
			got := mode{token: tc.token}.sessionHeaders("h", "conv-1", "POD")
			if len(got) != len(tc.want) || got["h"] != tc.want["h"] {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// The same seed abandons the same conversations, round(share × n) of them.
func TestAbandonedSet(t *testing.T) {
	for _, tc := range []struct {
		n     int
		share float64
		want  int
	}{{32, 0.3, 10}, {32, 0, 0}, {3, 0.5, 2}, {10, 0.99, 10}} {
		a, b := abandonedSet(7, tc.n, tc.share), abandonedSet(7, tc.n, tc.share)
		if countTrue(a) != tc.want {
			t.Errorf("n %d share %v: %d abandoned, want %d", tc.n, tc.share, countTrue(a), tc.want)
		}
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("n %d share %v: two draws of one seed differ", tc.n, tc.share)
			}
		}
	}
}

func TestRequestIDSafe(t *testing.T) {
	if got := requestIDSafe("conv-1-2-t3-with-pod@15s"); got != "conv-1-2-t3-with-pod.15s" {
		t.Errorf("got %q", got)
	}
}
