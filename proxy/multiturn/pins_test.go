package multiturn

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestPinsLedger: pins count until their deadline (at most a bucket's
// second late), a release takes off only what is still counted, and a
// clock that jumps past the whole ring forgets everything.
func TestPinsLedger(t *testing.T) {
	type step struct {
		at      time.Duration // from the start
		pin     int           // tokens pinned at this step (0: none)
		release int           // index of an earlier pin released (-1: none)
		want    int64
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"held for the TTL, then gone", []step{
			{0, 100, -1, 100}, {5 * time.Second, 50, -1, 150}, {9 * time.Second, 0, -1, 150},
			{11 * time.Second, 0, -1, 50}, {16 * time.Second, 0, -1, 0}}},
		{"a release takes off its own", []step{
			{0, 100, -1, 100}, {time.Second, 40, -1, 140}, {2 * time.Second, 0, 0, 40}}},
		{"a release after the deadline changes nothing", []step{
			{0, 100, -1, 100}, {3 * time.Second, 7, -1, 107}, {12 * time.Second, 0, 0, 7}}},
		{"a jump past the ring", []step{
			{0, 100, -1, 100}, {time.Hour, 5, -1, 5}, {time.Hour + 11*time.Second, 0, -1, 0}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Unix(7000, 300_000_000)
			c := &fakeClock{t: start}
			p := NewPins(10*time.Second, c.now)
			var deadlines []time.Time
			var tokens []int
			for i, s := range tc.steps {
				c.t = start.Add(s.at)
				if s.pin > 0 {
					deadlines, tokens = append(deadlines, p.Pin(s.pin)), append(tokens, s.pin)
				}
				if s.release >= 0 {
					p.Release(deadlines[s.release], tokens[s.release])
				}
				assert.Equal(t, s.want, p.Tokens(), "step %d", i)
			}
		})
	}
}
