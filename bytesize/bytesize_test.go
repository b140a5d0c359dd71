package bytesize

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]int{"4096": 4096, "0": 0, "4KiB": 4 << 10, "64MiB": 64 << 20, "1GiB": 1 << 30, "4KB": 4000, "12B": 12} {
		got, err := Parse(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "-1KiB", "2GiB", "1025MiB", "4kb", "KiB", "x", "+4KiB", "04KiB"} {
		_, err := Parse(bad)
		assert.Error(t, err, bad)
	}
}

func TestParseList(t *testing.T) {
	got, err := ParseList("4KiB, 64KiB,1MiB,4096")
	require.NoError(t, err)
	assert.Equal(t, []int{4 << 10, 64 << 10, 1 << 20, 4096}, got)
	for _, bad := range []string{"", "0", "4KiB,,1MiB", "2GiB", "x"} {
		_, err := ParseList(bad)
		assert.Error(t, err, "%q", bad)
	}
}

func TestFormat(t *testing.T) {
	for n, want := range map[int]string{4096: "4KiB", 1 << 20: "1MiB", 4 << 30: "4GiB", 1000: "1000B", 1536: "1536B"} {
		assert.Equal(t, want, Format(n))
	}
}
