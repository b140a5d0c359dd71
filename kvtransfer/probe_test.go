package kvtransfer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/pd-sidecar/pd-sidecar/kvtransfer"
)

func TestProbeLayout(t *testing.T) {
	type read struct{ n, off int }
	layout := func(dst [][]byte, region int) []read {
		var out []read
		kvtransfer.ProbeLayout(dst, region, func(p []byte, off int) { out = append(out, read{len(p), off}) })
		return out
	}
	buf := make([]byte, 100)
	for _, tc := range []struct {
		name   string
		dst    [][]byte
		region int
		want   []read
	}{
		{"no blocks: the smallest read", nil, 64, []read{{kvtransfer.ProbeMinBytes, 0}}},
		{"distinct blocks cycle through the region", [][]byte{buf[0:30], buf[30:60], buf[60:90]}, 64, []read{{30, 0}, {30, 30}, {30, 0}}},
		{"a block larger than the region in pieces", [][]byte{make([]byte, 150)}, 64, []read{{64, 0}, {64, 0}, {22, 0}}},
		{"blocks in one buffer read one remote buffer", [][]byte{buf[10:40], buf[10:40], buf[10:40]}, 64, []read{{30, 0}, {30, 0}, {30, 0}}},
		{"one buffer after another block", [][]byte{buf[0:30], buf[50:80], buf[50:80]}, 64, []read{{30, 0}, {30, 30}, {30, 30}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, layout(tc.dst, tc.region))
		})
	}
}
