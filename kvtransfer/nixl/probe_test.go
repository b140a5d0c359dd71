//go:build cgo

package nixl

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestMergeSpans(t *testing.T) {
	for _, tc := range []struct {
		name   string
		in     []Desc
		merged []Desc
	}{
		{"disjoint, unsorted", []Desc{{Addr: 300, Len: 10}, {Addr: 100, Len: 10}}, []Desc{{Addr: 100, Len: 10}, {Addr: 300, Len: 10}}},
		{"the same buffer many times", []Desc{{Addr: 100, Len: 64}, {Addr: 100, Len: 64}, {Addr: 100, Len: 64}}, []Desc{{Addr: 100, Len: 64}}},
		{"adjacent blocks", []Desc{{Addr: 100, Len: 50}, {Addr: 150, Len: 50}}, []Desc{{Addr: 100, Len: 100}}},
		{"one inside another", []Desc{{Addr: 100, Len: 100}, {Addr: 120, Len: 10}}, []Desc{{Addr: 100, Len: 100}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]Desc(nil), tc.in...)
			assert.Equal(t, tc.merged, mergeSpans(tc.in))
			assert.Equal(t, in, tc.in, "the input is not changed")
		})
	}
}
