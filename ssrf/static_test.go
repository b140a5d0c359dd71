package ssrf

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStaticAllowed(t *testing.T) {
	s, err := ParseStatic([]string{
		"10.1.0.0/16", "192.168.0.0/24:8000", "10.9.9.9:8100", "[fd00::/8]:9000", "[fd01::1]:*",
		"prefill-0.prefill.ns.svc:8000", "*.pool.ns.svc:8200", " ",
	})
	require.NoError(t, err)
	assert.Equal(t, 7, s.Len())
	cases := []struct {
		hp   string
		want bool
	}{
		{"10.1.2.3:1", true},
		{"10.1.2.3:65535", true},
		{"10.2.0.1:8000", false},
		{"192.168.0.7:8000", true},
		{"192.168.0.7:8001", false},
		{"10.9.9.9:8100", true},
		{"10.9.9.9:8101", false},
		{"[::ffff:10.9.9.9]:8100", true},
		{"[fd00::5]:9000", true},
		{"[fd00::5]:9001", false},
		{"[fd01::1]:4", true},
		{"[fd01:0:0::1]:4", true},
		{"prefill-0.prefill.ns.svc:8000", true},
		{"PREFILL-0.prefill.ns.svc:8000", true},
		{"prefill-0.prefill.ns.svc:8001", false},
		{"a.pool.ns.svc:8200", true},
		{"pool.ns.svc:8200", false},
		{"evil.svc:8200", false},
		{"10.1.2.3", false},
		{"10.1.2.3:0", false},
		{"10.1.2.3:99999", false},
		{"[fe80::1%eth0]:9000", false},
		{"", false},
		{"metadata.google.internal:80", false},
		{"169.254.169.254:80", false},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, s.Allowed(c.hp), c.hp)
	}
}

func TestParseStaticErrors(t *testing.T) {
	for _, e := range []string{"10.0.0.0/33", "host", "host:0", "host:x", "bad_name:80", "10.0.0.1:70000", "*:80"} {
		_, err := ParseStatic([]string{e})
		assert.Error(t, err, e)
	}
}

func TestAny(t *testing.T) {
	a, err := ParseStatic([]string{"10.0.0.1:1"})
	require.NoError(t, err)
	b, err := ParseStatic([]string{"10.0.0.2:2"})
	require.NoError(t, err)
	assert.True(t, Any{a, b}.Allowed("10.0.0.2:2"))
	assert.False(t, Any{a, b}.Allowed("10.0.0.3:2"))
	assert.False(t, Any{}.Allowed("10.0.0.1:1"))
}

func TestParsePool(t *testing.T) {
	c, err := ParsePool("ns/pool", GroupV1)
	require.NoError(t, err)
	assert.Equal(t, "v1", c.GVR().Version)
	c, err = ParsePool("ns/pool", GroupV1Alpha2)
	require.NoError(t, err)
	assert.Equal(t, "v1alpha2", c.GVR().Version)
	c, err = ParsePool("pool", GroupV1)
	require.NoError(t, err, "a bare name is in namespace default")
	assert.Equal(t, PoolConfig{Namespace: "default", Name: "pool", Group: GroupV1}, c)
	for _, ref := range []string{"", "/pool", "ns/", "/", "a/b/c"} {
		_, err := ParsePool(ref, GroupV1)
		assert.Error(t, err, ref)
	}
	_, err = ParsePool("ns/pool", "example.com")
	assert.Error(t, err)
}
