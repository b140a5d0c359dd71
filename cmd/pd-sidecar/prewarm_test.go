package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestStaticPrefillers(t *testing.T) {
	for _, tc := range []struct {
		entries []string
		want    []string
	}{
		{nil, nil},
		{[]string{"10.0.0.7:8000"}, []string{"10.0.0.7:8000"}},
		{[]string{"prefill-0.pd.svc:8000", "[fd00::7]:8000"}, []string{"prefill-0.pd.svc:8000", "[fd00::7]:8000"}},
		{[]string{"10.0.0.0/8", "10.0.0.7:*", "*.pd.svc:8000", "10.0.0.7", "10.0.0.7:99999", ":8000"}, nil},
	} {
		assert.Equal(t, tc.want, staticPrefillers(tc.entries), "%v", tc.entries)
	}
}
