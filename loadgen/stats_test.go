package loadgen

import (
	"testing"

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
