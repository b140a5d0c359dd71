package loadgen

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestSummarizeBodyBytes: the body bytes of every request sent are summed,
// failed ones included (the proxy read them too).
func TestSummarizeBodyBytes(t *testing.T) {
	s := Summarize(&TargetResults{Results: []Result{{BodyBytes: 1000, Tokens: 3}, {BodyBytes: 500, Err: ErrKindCut}}})
	assert.EqualValues(t, 1500, s.BodyBytes)
	assert.Equal(t, 1, s.OK)
	assert.Equal(t, 1, s.CutShort)
}

func TestMedian(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		in   []time.Duration
		want time.Duration
	}{
		{nil, 0},
		{[]time.Duration{3 * ms}, 3 * ms},
		{[]time.Duration{9 * ms, 1 * ms, 5 * ms}, 5 * ms},
		{[]time.Duration{4 * ms, 1 * ms, 2 * ms, 3 * ms}, 2500 * time.Microsecond},
	} {
		if got := Median(tc.in); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
